"""The shared Spark Connect server (spark_checkers/connect_server.py) and the session choice
(spark_checkers/session.py): Connect and classic give the same reports; a second command reuses a running
server; a server whose starting command was SIGKILLed still ends (idle timeout, enforced by the watchdog); an
unreachable --spark-remote is unknown (exit 2) naming the endpoint; a malformed one is a usage error (3); the
server JVM's class archive is written, mapped, survived when damaged, and pruned when no server can map it."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from contracts.exit_codes import EXIT_USAGE
from spark_checkers import connect_server
from spark_checkers import synthetic as s
from spark_checkers.defaults import WARM_UP_BIG_ROUNDS, WARM_UP_MIN_EVENTS
from spark_checkers.session import SparkChoice, choose, validate_remote

ORDEAL = [sys.executable, "-m", "ordeal.cli"]
ROOT = Path(__file__).resolve().parents[2]


def _catalog():
    spec = importlib.util.spec_from_file_location("anomaly_catalog", Path(__file__).with_name(
        "test_checkers_anomalies.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.CASES, module.UNKNOWN_CASES


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
from spark_checkers.session import spark_session
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


# --- Pure: the choice --------------------------------------------------------------------------------------


def test_choice_precedence(monkeypatch):
    monkeypatch.delenv("ORDEAL_SPARK_REMOTE", raising=False)
    monkeypatch.delenv("ORDEAL_SPARK_MASTER", raising=False)
    monkeypatch.setattr("spark_checkers.session._active_classic", lambda: None)
    assert choose() == SparkChoice("local-connect", "")
    assert choose("local[1]") == SparkChoice("classic", "local[1]")
    assert choose("local[1]", "sc://h:1") == SparkChoice("remote", "sc://h:1")
    monkeypatch.setenv("ORDEAL_SPARK_MASTER", "local[3]")
    assert choose() == SparkChoice("classic", "local[3]")
    monkeypatch.setenv("ORDEAL_SPARK_REMOTE", "sc://h:2")
    assert choose() == SparkChoice("remote", "sc://h:2")
    assert choose("local[1]") == SparkChoice("classic", "local[1]")  # a flag beats the environment


@pytest.mark.parametrize("url", ["http://h:1", "sc://", "h:15002", "sc://h:notaport"])
def test_malformed_endpoint_is_refused(url):
    with pytest.raises(ValueError, match="Spark Connect endpoint"):
        validate_remote(url)


def test_malformed_remote_is_a_usage_error(tmp_path):
    done = _run(["check", str(tmp_path), "--spark-remote", "http://127.0.0.1:1"])
    assert done.returncode == 3, done.stderr
    assert "expected sc://HOST:PORT" in done.stderr


# --- Against Spark -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def catalog_dirs(tmp_path_factory):
    cases, unknown_cases = _catalog()
    root = tmp_path_factory.mktemp("catalog")
    dirs = []
    for name, (spec, mutate, *rest) in {**cases, **unknown_cases}.items():
        rows = s.generate(spec)
        rows = mutate(rows) if mutate else rows
        dirs.append(s.write_run(root / name, rows, spec, **(rest[0] if name in unknown_cases else {})))
    return dirs


@pytest.mark.spark
@pytest.mark.timeout(1200)
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
def test_spark_start_warms_the_running_server_up_once(server):
    """`ordeal spark start --warm-up` on a running server: both plan shapes checked there (each finding what its
    history plants), the record in `ordeal spark status` belongs to that server, and a second warm-up of the
    same server is skipped.  The bulk history at 100k events, not the default 1 M (its checks are the same
    code; test_checker_build checks ``api.warm_up`` itself): the default took 117 s of CI here."""
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

def _describe(root: Path, name: str, pyspark: str, **changes) -> Path:
    """An archive and the JSON beside it, as a server leaves them."""
    key = {"pyspark": pyspark, "version": "4.3.0", "jars_mtime_ns": 1, "java": "/usr/bin/java",
           "java_options": "-Xss4m", "memory": "2g", **changes}
    (root / f"{name}.json").write_text(json.dumps(key))
    (root / f"{name}.jsa").write_bytes(b"archive")
    return root / f"{name}.jsa"


def test_archives_no_server_can_map_again_are_pruned_and_the_others_kept(tmp_path):
    ours = tmp_path / "pyspark"
    ours.mkdir()
    key = {"pyspark": str(ours), "version": "4.3.0", "jars_mtime_ns": 1, "java": "/usr/bin/java",
           "java_options": "-Xss4m", "memory": "2g"}
    keep = _describe(tmp_path, "spark-connect-ours", str(ours))
    other_setting = _describe(tmp_path, "spark-connect-b", str(ours), java_options="-Xss8m")  # near miss: kept
    reinstalled = _describe(tmp_path, "spark-connect-c", str(ours), jars_mtime_ns=2)
    upgraded = _describe(tmp_path, "spark-connect-d", str(ours), version="4.2.0")
    gone = _describe(tmp_path, "spark-connect-e", str(tmp_path / "deleted-clone"))
    unreadable = _describe(tmp_path, "spark-connect-f", str(ours))
    unreadable.with_suffix(".json").write_text("{not json")
    stale, fresh = tmp_path / "x.jsa.1.part", tmp_path / "x.jsa.2.part"
    for part in (stale, fresh):
        part.write_bytes(b"half")
    os.utime(stale, (time.time() - connect_server.STALE_PART_S - 60,) * 2)

    connect_server._prune_archives(tmp_path, key, keep)

    left = {p.name for p in tmp_path.iterdir()} - {"pyspark"}
    assert left == {keep.name, keep.with_suffix(".json").name, other_setting.name,
                    other_setting.with_suffix(".json").name, fresh.name}, left
    for removed in (reinstalled, upgraded, gone, unreadable):
        assert not removed.exists() and not removed.with_suffix(".json").exists()


def test_the_archive_settings_are_checked(tmp_path, monkeypatch):
    monkeypatch.setenv("ORDEAL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("ORDEAL_JVM_CACHE_DIR", raising=False)
    monkeypatch.setenv(connect_server.ARCHIVE_ENV, "1")
    assert connect_server.archive_dir() == tmp_path / "cache" / "jvm"  # beside the server's state by default
    monkeypatch.setenv(connect_server.ARCHIVE_ENV, "0")
    assert connect_server.archive_dir() is None
    monkeypatch.setenv(connect_server.ARCHIVE_ENV, "yes")
    with pytest.raises(connect_server.ConnectServerError, match="expected 1 .* or 0"):
        connect_server.archive_dir()
    monkeypatch.setenv(connect_server.ARCHIVE_ENV, "1")
    a_file = tmp_path / "file"
    a_file.write_text("")
    monkeypatch.setenv("ORDEAL_JVM_CACHE_DIR", str(a_file))
    with pytest.raises(connect_server.ConnectServerError, match="is not a directory"):
        connect_server.archive_dir()


@pytest.mark.parametrize("stopping", [{"status": "stopping"}, {"status": "ready", "stop.request": True}])
def test_a_client_never_takes_a_stopping_server(tmp_path, monkeypatch, stopping):
    """The client's side of a stop (the server side: the real-server archive test below).  A server whose state says
    stopping, or that was asked to stop, is outwaited: a background start (``session.prepare``) returns at once and
    starts nothing, and a waiting client waits until its watchdog has ended.  The near miss: a ready server."""
    import fcntl
    import threading

    monkeypatch.setenv("ORDEAL_CACHE_DIR", str(tmp_path))
    p = connect_server.paths()
    spawned: list = []
    monkeypatch.setattr(connect_server, "_spawn_watchdog", lambda *args: spawned.append(args))
    alive = os.open(p.alive, os.O_RDWR | os.O_CREAT)
    fcntl.flock(alive, fcntl.LOCK_EX)  # a watchdog that lives, as far as any client can tell
    try:
        p.state.write_text(json.dumps({"status": "ready"}))
        assert connect_server.ensure_started(wait=False) == {"status": "ready"}
        assert not connect_server._stopping(p, {"status": "ready"})
        state = {k: v for k, v in stopping.items() if k != "stop.request"}
        p.state.write_text(json.dumps(state))
        if stopping.get("stop.request"):
            p.stop_request.write_text("1")
        assert connect_server._stopping(p, state)
        started = time.monotonic()
        assert connect_server.ensure_started(wait=False) == state
        assert time.monotonic() - started < 1 and not spawned
        threading.Timer(0.5, fcntl.flock, [alive, fcntl.LOCK_UN]).start()  # the watchdog ends in half a second
        connect_server._outwait_stopping(p, timeout=10)
        assert time.monotonic() - started >= 0.5
        assert not connect_server.watchdog_alive(p)
    finally:
        connect_server.release_lease()
        os.close(alive)


@pytest.mark.parametrize("command", [["spark", "start"], ["check", "RUN"]])
@pytest.mark.parametrize("setting", [{connect_server.ARCHIVE_ENV: "yes"}, {"ORDEAL_JVM_CACHE_DIR": "FILE"}])
def test_a_bad_archive_setting_is_a_usage_error_before_anything_starts(tmp_path, command, setting):
    a_file = tmp_path / "file"
    a_file.write_text("")
    env = {k: str(a_file) if v == "FILE" else v for k, v in setting.items()}
    done = _run([str(tmp_path) if a == "RUN" else a for a in command],
                {**env, "ORDEAL_CACHE_DIR": str(tmp_path / "cache")})
    assert done.returncode == EXIT_USAGE, done.stderr
    assert next(iter(setting)) in done.stderr, done.stderr
    assert not (tmp_path / "cache" / "spark-connect").exists()  # no server was started


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
