"""A run killed mid-way (SIGKILL) or stopped (SIGTERM) leaves a readable history marked incomplete, and no
processes: the broker nodes die with the harness."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_run_pipeline import out_dir, pid_alive  # noqa: F401  (same directory: fixture re-use)

from contracts.history_schema import Kind
from harness.history import read_history, read_manifest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def _start_run(scenario: str, out: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ordeal.cli", "run", scenario, "--seed", "2", "--out", str(out),
                             "--no-check"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)


def _wait_for_workload(out: Path, process: subprocess.Popen, timeout: float = 60.0) -> Path:
    """The run directory once the history holds deliveries (the workload is under way)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stderr.read().decode()[-2000:]
        for run_dir in out.glob("*/history"):
            try:
                if read_manifest(run_dir).get("counts_recorded", {}).get(Kind.DELIVERY, 0) > 0:
                    return run_dir.parent
            except Exception:  # noqa: BLE001 - the manifest is being replaced right now
                pass
        time.sleep(0.2)
    raise AssertionError("the run never reached its workload")


def _node_pids(run_dir: Path) -> set[int]:
    pids = set()
    for row in read_history(run_dir / "history").to_pylist():
        if row["kind"] == Kind.NODE_EVENT and row["detail"]:
            pid = json.loads(row["detail"]).get("pid")
            if pid:
                pids.add(pid)
    topology = run_dir / "topology.json"
    if topology.exists():
        pids |= {n["pid"] for n in json.loads(topology.read_text()).get("nodes", []) if n.get("pid")}
    return pids


def _processes_mentioning(run_dir: Path) -> set[int]:
    """Every live process whose command line names the run directory (configs, data dirs, logs)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if str(run_dir).encode() in (entry / "cmdline").read_bytes() and pid_alive(int(entry.name)):
                found.add(int(entry.name))
        except OSError:
            pass
    return found


def _sigkill(process: subprocess.Popen) -> None:
    """SIGKILL the ordeal process alone (what it started must die with it) and reap it; its process group
    too if it somehow survives."""
    try:
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _leftovers_killed(pids: set[int], run_dir: Path) -> set[int]:
    """The processes of ``pids`` or naming ``run_dir`` still alive after a grace period, each SIGKILLed so
    the test leaves nothing behind even when it fails on them."""
    leftover = _wait_gone(pids) | _processes_mentioning(run_dir)
    for pid in leftover:
        os.kill(pid, signal.SIGKILL)
    return leftover


def _wait_gone(pids: set[int], timeout: float = 15.0) -> set[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = {p for p in pids if pid_alive(p)}
        if not alive:
            return alive
        time.sleep(0.1)
    return {p for p in pids if pid_alive(p)}


@pytest.mark.parametrize("scenario", ["mosquitto-smoke", "p2p-smoke"])
def test_sigkill_mid_run_leaves_incomplete_readable_history_and_no_processes(out_dir: Path, scenario: str):  # noqa: F811
    process = _start_run(scenario, out_dir)
    try:
        run_dir = _wait_for_workload(out_dir, process)
        pids = _node_pids(run_dir) | _processes_mentioning(run_dir)
        assert len(pids) > len(_node_pids(run_dir)) or scenario == "p2p-smoke", "the broker itself is seen"
    finally:
        _sigkill(process)
    leftover = _leftovers_killed(pids, run_dir)
    assert not leftover, f"processes outlived the killed run: {leftover}"
    manifest = read_manifest(run_dir / "history")
    assert manifest["complete"] is False
    table = read_history(run_dir / "history")
    assert table.num_rows >= manifest["rows"] > 0
    assert not (run_dir / "summary.json").exists()


def test_sigterm_ends_the_run_cleanly_but_incomplete(out_dir: Path):  # noqa: F811
    process = _start_run("mosquitto-smoke", out_dir)
    try:
        run_dir = _wait_for_workload(out_dir, process)
        pids = _node_pids(run_dir) | _processes_mentioning(run_dir)
        os.kill(process.pid, signal.SIGTERM)
        code = process.wait(timeout=30)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert code == 2
    assert not _wait_gone(pids, 5.0) and not _processes_mentioning(run_dir)
    manifest = read_manifest(run_dir / "history")
    assert manifest["complete"] is False and "interrupted" in manifest["incomplete_reason"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["exit_code"] == 2 and summary["history_complete"] is False
    assert summary["counts"]["rows"] == read_history(run_dir / "history").num_rows
