"""The shared Spark Connect server (spark_checkers/engine/connect_server.py) against a real JVM: Connect and classic give
the same reports; a second command reuses a running server; a server whose starting command was SIGKILLed still
ends (idle timeout, enforced by the watchdog); an unreachable --spark-remote is unknown (exit 2) naming the
endpoint; the server JVM's class archive is written, mapped and survived when damaged.  The settings that need no
JVM (the session choice, usage errors, pruning the archives): tests/unit/test_spark_connect_settings.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from support.anomalies import write_runs

from contracts.exit_codes import EXIT_USAGE
from spark_checkers.defaults import WARM_UP_BIG_ROUNDS, WARM_UP_MIN_EVENTS
from spark_checkers.engine import connect_server

ORDEAL = [sys.executable, "-m", "ordeal.cli"]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    """A private state directory: this module's server is its own, never a user's."""
    path = tmp_path_factory.mktemp("ordeal-cache")
    previous = os.environ.get("ORDEAL_CACHE_DIR")
    os.environ["ORDEAL_CACHE_DIR"] = str(path)
    yield path
    connect_server.release_lease()
    connect_server.stop()
    if previous is None:
        os.environ.pop("ORDEAL_CACHE_DIR", None)
    else:
        os.environ["ORDEAL_CACHE_DIR"] = previous


@pytest.fixture(scope="module")
def server(cache_dir):
    """This module's shared local server, started here; used by child processes only: pyspark refuses classic
    and Connect sessions in one process (a Connect session switches pyspark.sql.functions to Connect columns
    process-wide), and this process holds the classic ``spark`` fixture."""
    return connect_server.ensure_started()


CHECK_CHILD = """
import json, sys
from spark_checkers.api import check_runs
from spark_checkers.engine.spark_session import spark_session
reports = check_runs(sys.argv[3:], spark=spark_session(sys.argv[2] or None))
open(sys.argv[1], "w").write(json.dumps(reports))
"""


def _check_in_child(dirs, out: Path, master: str = "") -> list[dict]:
    """check_runs in a process of its own, on the local server ("") or a classic session (a master)."""
    env = {k: v for k, v in os.environ.items() if k not in ("ORDEAL_SPARK_MASTER", "ORDEAL_SPARK_REMOTE")}
    done = subprocess.run([sys.executable, "-c", CHECK_CHILD, str(out), master, *map(str, dirs)], cwd=ROOT,
                          capture_output=True, text=True, timeout=1100, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


def _run(args, env=None, **kwargs):
    return subprocess.run([*ORDEAL, *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **(env or {})}, timeout=600, **kwargs)


def _essence(report: dict) -> dict:
    """What must not depend on the engine: verdicts, counts, witnesses' data, the run's counts."""
    return {"verdict": report["verdict"], "exit_code": report["exit_code"], "counts": report["counts"],
            "invariants": {i["id"]: (i["verdict"], i["count"], i.get("reason"),
                                     [w["data"] for w in i.get("witnesses", [])]) for i in report["invariants"]}}


@pytest.fixture(scope="module")
def catalog_dirs(tmp_path_factory):
    return list(write_runs(tmp_path_factory.mktemp("catalog")).values())


@pytest.mark.spark
@pytest.mark.timeout(1200)
# Nightly for its time (about 2 minutes): CI keeps the same agreement on a real run (tests/integration/
# test_spark_connect_run.py) and checks the catalog on the classic session (test_checkers_anomalies.py).
@pytest.mark.nightly
def test_connect_and_classic_agree_on_the_anomaly_catalog(server, catalog_dirs, tmp_path):
    """Both in child processes, so whichever engine this pytest process holds does not matter."""
    connect = _check_in_child(catalog_dirs, tmp_path / "connect.json")
    classic = _check_in_child(catalog_dirs, tmp_path / "classic.json", "local[2]")
    assert connect[0]["environment"]["spark_master"] == f"sc://127.0.0.1:{server['port']} (local, shared)"
    assert classic[0]["environment"]["spark_master"] == "local[2]"
    assert {r["verdict"] for r in classic} == {"pass", "fail", "unknown"}  # the catalog has all three
    for d, a, b in zip(catalog_dirs, classic, connect, strict=True):
        assert _essence(a) == _essence(b), d.name


@pytest.mark.spark
@pytest.mark.timeout(900)
def test_unreachable_remote_is_unknown_naming_the_endpoint(catalog_dirs):
    run_dir = catalog_dirs[0]
    for args, env in ((["--spark-remote", "sc://127.0.0.1:1"], {}), ([], {"ORDEAL_SPARK_REMOTE": "sc://127.0.0.1:1"})):
        done = _run(["check", str(run_dir), *args], env=env)
        assert done.returncode == 2, done.stdout + done.stderr
        report = json.loads((run_dir / "report.json").read_text())
        assert report["verdict"] == "unknown"
        reasons = {i["reason"] for i in report["invariants"] if i["verdict"] == "unknown"}
        assert reasons and all("sc://127.0.0.1:1" in r and "unreachable" in r for r in reasons), reasons


@pytest.mark.spark
@pytest.mark.timeout(900)
def test_a_second_command_reuses_the_running_server(server, catalog_dirs):
    state = connect_server.read_state(connect_server.paths())
    done = _run(["check", str(catalog_dirs[0])])
    assert done.returncode in (0, 1), done.stdout + done.stderr
    report = json.loads((catalog_dirs[0] / "report.json").read_text())
    assert report["environment"]["spark_master"] == f"sc://127.0.0.1:{state['port']} (local, shared)"
    after = connect_server.read_state(connect_server.paths())
    assert (after["watchdog_pid"], after["jvm_pid"], after["started_unix"]) == (
        state["watchdog_pid"], state["jvm_pid"], state["started_unix"])


@pytest.mark.spark
@pytest.mark.timeout(900)
# Nightly for its time (about 100 s): how fast a warm server answers, not what it answers; CI's commands use
# a server of their own either way (tests/conftest.py).
@pytest.mark.nightly
def test_spark_start_warms_the_running_server_up_once(server):
    """`ordeal spark start --warm-up` on a running server: both plan shapes checked there (each finding what its
    history plants), the record in `ordeal spark status` belongs to that server, and a second warm-up of the
    same server is skipped.  The bulk history at 100k events, not the default 1 M (its checks are the same
    code; test_checker_build checks ``api.warm_up`` itself): the default is too slow for every CI run."""
    too_small = _run(["spark", "start", "--warm-up", "--warm-up-events", str(WARM_UP_MIN_EVENTS - 1)])
    assert too_small.returncode == EXIT_USAGE and "--warm-up-events" in too_small.stderr, too_small.stderr
    alone = _run(["spark", "start", "--warm-up-events", "100000"])
    assert alone.returncode == EXIT_USAGE and "give --warm-up too" in alone.stderr, alone.stderr
    done = _run(["spark", "start", "--warm-up", "--warm-up-events", "100000"])
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("warm-up: ")]
    plans = ["small", *["big"] * WARM_UP_BIG_ROUNDS]
    assert [line.split(",")[0] for line in lines] == [f"warm-up: {p} plan" for p in plans], done.stdout
    assert all(90_000 < int(line.split(", ")[1].split()[0]) < 110_000 for line in lines[1:]), lines  # about 100k
    status = json.loads(_run(["spark", "status"]).stdout)
    record = status["warmed_up"]
    assert record["server_started_unix"] == server["started_unix"]
    assert [(c["plan"], c["found"] == c["planted"]) for c in record["checks"]] == [(p, True) for p in plans]
    again = _run(["spark", "start", "--warm-up"])
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"already warmed up ({len(plans)} checks" in again.stdout and "warm-up: " not in again.stdout


@pytest.mark.spark
@pytest.mark.timeout(900)
def test_a_killed_command_leaves_no_server_it_started(tmp_path, catalog_dirs):
    """The server is meant to outlive a command, so a SIGKILLed command's server must end on its own: the
    watchdog sees no lease (the kernel dropped the dead client's flock) and stops it after the idle timeout."""
    env = {"ORDEAL_CACHE_DIR": str(tmp_path / "cache"), "ORDEAL_SPARK_IDLE_TIMEOUT": "3"}
    command = subprocess.Popen([*ORDEAL, "check", str(catalog_dirs[0])], cwd=ROOT, env={**os.environ, **env},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    state_file = tmp_path / "cache" / "spark-connect" / "state.json"
    try:
        deadline = time.monotonic() + 300
        state = None
        while time.monotonic() < deadline and command.poll() is None:
            state = json.loads(state_file.read_text()) if state_file.exists() else None
            if state and state.get("jvm_pid"):
                break
            time.sleep(0.1)
        assert state and state.get("jvm_pid"), "the command never started a server"
    finally:
        os.killpg(command.pid, signal.SIGKILL)
        command.wait()
    server = [state["watchdog_pid"], state["jvm_pid"]]
    assert any(psutil.pid_exists(pid) for pid in server), "the server died with the command: not shared"
    # start (if killed while starting), 3 s idle, 15 s graceful stop, and the class archive's writing if this is
    # the test session's first server to stop
    deadline = time.monotonic() + 120 + connect_server.ARCHIVE_GRACE_S
    while any(_running(pid) for pid in server) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not any(_running(pid) for pid in server), f"left behind: {server}"
    assert not state_file.exists()


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# --- The class archive (connect_server.ClassArchive) -----------------------------------------------------------


@pytest.mark.spark
@pytest.mark.timeout(900)
def test_a_server_leaves_a_class_archive_the_next_one_maps(tmp_path):
    """A stopped server leaves its JVM's class-data sharing archive (connect_server.ClassArchive); the next server's
    JVM maps it.  A truncated one (which crashes the JVM that maps it) makes the server start again without it, and
    write a whole one when it stops; a damaged header (which the JVM refuses) is removed, and the next server writes
    a new one.  While a server writes it, `spark stop` says why it waits, and a command that arrives then waits for
    that server to end and starts a new one, never connecting to the dying one."""
    jvm_dir = tmp_path / "jvm"
    env = {"ORDEAL_CACHE_DIR": str(tmp_path / "cache"), "ORDEAL_JVM_CACHE_DIR": str(jvm_dir),
           connect_server.ARCHIVE_ENV: "1"}
    state_file = tmp_path / "cache" / "spark-connect" / "state.json"
    log = tmp_path / "cache" / "spark-connect" / "server.log"
    said: list[str] = []  # what each `spark stop` wrote to stderr

    def start() -> str:
        """The JVM's memory map."""
        started = _run(["spark", "start"], env)
        assert started.returncode == 0, started.stderr + log.read_text()[-3000:]
        return Path(f"/proc/{json.loads(state_file.read_text())['jvm_pid']}/maps").read_text()

    def stop() -> None:
        stopped = _run(["spark", "stop"], env)
        assert stopped.returncode == 0, stopped.stderr
        said.append(stopped.stderr)

    def start_and_stop() -> str:
        """The JVM's memory map while it ran."""
        try:
            return start()
        finally:
            stop()

    start()
    first = json.loads(state_file.read_text())["watchdog_pid"]
    stopping = subprocess.Popen([*ORDEAL, "spark", "stop"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, cwd=ROOT, env={**os.environ, **env})
    try:
        deadline = time.monotonic() + 60
        while (connect_server.read_state(connect_server.Paths(state_file.parent)) or {}).get("status") != "stopping":
            assert time.monotonic() < deadline and stopping.poll() is None, stopping.communicate()
            time.sleep(0.05)
        maps = start()  # arrives while the first server writes its archive
    finally:
        _, err = stopping.communicate(timeout=300)
    assert stopping.returncode == 0, err
    assert "writes its class archive" in err, err
    assert json.loads(state_file.read_text())["watchdog_pid"] != first  # a new server, started once the old one ended
    stop()
    assert "class archive" not in said[-1]  # the near miss: a server that mapped the archive writes none
    archives = list(jvm_dir.glob("*.jsa"))
    assert len(archives) == 1 and not list(jvm_dir.glob("*.part")), list(jvm_dir.iterdir())
    assert str(archives[0]) in maps  # the arriving command's server mapped the archive its predecessor wrote
    assert archives[0].with_suffix(".json").exists()  # what it was made for, for pruning
    assert "Skipping" not in log.read_text()  # the JVM's warnings per class left out are not logged
    whole = archives[0].read_bytes()
    archives[0].chmod(0o644)
    archives[0].write_bytes(whole[: len(whole) // 4])
    maps = start_and_stop()
    assert str(archives[0]) not in maps
    assert "starting it again without the archive" in log.read_text()
    assert archives[0].stat().st_size > len(whole) // 2  # written whole again when that server stopped
    assert list((tmp_path / "cache" / "spark-connect").glob("hs_err_pid*.log"))  # the crash's report, kept there
    assert not list(ROOT.glob("hs_err_pid*.log"))

    archives[0].chmod(0o644)
    with archives[0].open("r+b") as f:  # the header's magic number: the JVM refuses the archive and runs without
        f.write(b"\0\0\0\0")
    assert str(archives[0]) not in start_and_stop()
    assert "did not map the class archive" in log.read_text()
    assert not archives[0].exists()
    assert str(archives[0]) not in start_and_stop()  # this one writes a new archive ...
    assert str(archives[0]) in start_and_stop()  # ... which its successor maps
