"""Spark Connect on real runs: the Connect and classic paths give the same report on a real p2p-smoke run
(with a planted defect, so there is something to find); a SIGKILLed `ordeal run` leaves no Spark Connect
server it started (the watchdog ends it after the idle timeout: docs/report.md, "The Spark the checks run
on")."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from contracts.scenario import find_scenario
from harness.run import run_scenario

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.timeout(1200)]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def out_dir():
    path = Path(tempfile.mkdtemp(prefix="ordeal-run-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _essence(report: dict) -> dict:
    return {"verdict": report["verdict"], "counts": report["counts"],
            "invariants": {i["id"]: (i["verdict"], i["count"], i.get("reason"),
                                     [w["data"] for w in i.get("witnesses", [])]) for i in report["invariants"]}}


def test_connect_and_classic_agree_on_a_real_run(out_dir: Path, tmp_path: Path):
    """Each check by `ordeal check` in a process of its own (pyspark refuses classic and Connect sessions in
    one process)."""
    source = find_scenario("p2p-smoke").read_text()
    scenario = tmp_path / "p2p-smoke-lossy.toml"
    # A defect of the catalog, so the reports have violations and witnesses to compare, not only passes.
    scenario.write_text(source.replace("[broker]", '[broker]\ndefects = ["dup_on_first_delivery"]', 1)
                        if "[broker]" in source else source + '\n[broker]\ndefects = ["dup_on_first_delivery"]\n')
    result = run_scenario(scenario, 1, out_dir, check=False)
    assert result.summary["history_complete"], result.summary
    reports = {}
    for engine, args in (("connect", []), ("classic", ["--spark-master", "local[2]"])):
        done = subprocess.run([sys.executable, "-m", "ordeal.cli", "check", str(result.run_dir), *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=900)
        assert done.returncode in (0, 1), done.stdout[-2000:] + done.stderr[-2000:]
        reports[engine] = json.loads((result.run_dir / "report.json").read_text())
    connect, classic = reports["connect"], reports["classic"]
    assert connect["environment"]["spark_master"].startswith("sc://")
    assert classic["environment"]["spark_master"] == "local[2]"
    assert _essence(connect) == _essence(classic)
    assert connect["verdict"] == "fail"  # the planted defect was found, the same way by both


def test_a_killed_ordeal_run_leaves_no_spark_connect_server(out_dir: Path, tmp_path: Path):
    cache = tmp_path / "cache"
    env = {**os.environ, "ORDEAL_CACHE_DIR": str(cache), "ORDEAL_SPARK_IDLE_TIMEOUT": "3"}
    command = subprocess.Popen([sys.executable, "-m", "ordeal.cli", "run", "p2p-smoke", "--no-isolated", "--out",
                                str(out_dir)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    state_file = cache / "spark-connect" / "state.json"
    state = None
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and command.poll() is None:
            state = json.loads(state_file.read_text()) if state_file.exists() else None
            if state and state.get("jvm_pid"):
                break
            time.sleep(0.1)
        assert state and state.get("jvm_pid"), "ordeal run did not start a Spark Connect server"
    finally:
        os.killpg(command.pid, signal.SIGKILL)
        command.wait()
    server = (state["watchdog_pid"], state["jvm_pid"])
    deadline = time.monotonic() + 120
    while any(_running(pid) for pid in server) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not any(_running(pid) for pid in server), f"left behind: watchdog, JVM = {server}"
    assert not state_file.exists()


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False
