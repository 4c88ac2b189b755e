"""`ordeal run` from the command line is isolated by default when root: it runs again under
``unshare --net --pid ...`` (harness/netns.py), so network faults are really applied, Spark checks inside
the namespace, paths and exit codes survive, and a SIGKILL of ``ordeal`` leaves no process behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_run_interrupted import (
    _leftovers_killed,
    _processes_mentioning,
    _sigkill,
    _wait_for_workload,
    _wait_gone,
)
from test_run_pipeline import out_dir  # noqa: F401  (same directory: fixture re-use)

from contracts.history_schema import Kind
from harness import netns
from harness.history import read_history

pytestmark = [pytest.mark.integration,
              pytest.mark.root(reason="isolation needs root")]
ROOT = Path(__file__).resolve().parents[2]

TINY_PARTITION = """
[scenario]
name = "tiny-partition"
duration_s = 7
drain_quiet_s = 1.5
drain_timeout_s = 40

[topology]
redis_masters = 3
redis_replicas_per_master = 0
broker_nodes = 1

[target]
kind = "reference"

[workload]
pattern = "p2p"
qos_mix = { qos1 = 1 }
pairs = 2
rate_per_publisher = 4

[faults]
mix = { net_partition = 1 }
params = { net_partition = { a = "client", b = "broker" } }
quiet_s = [1, 1]
duration_s = [1, 1.5]
tail_s = 3
max_faults = 1

[checks]
allowed = ["duplicates.redelivered_after_ack"]
"""


def _users_environment() -> dict[str, str]:
    """Started like a user would: without the test session's namespace marker, so `ordeal` isolates itself."""
    return {k: v for k, v in os.environ.items() if k not in (netns.MARKER, "SPARK_LOCAL_IP")}


def _ordeal_run(scenario: Path, out: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ordeal.cli", "run", str(scenario), "--seed", "3",
                             "--out", str(out), *extra], cwd=ROOT, env=_users_environment(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)


def _descendants(root: int) -> set[int]:
    """Every live process below ``root`` (host PIDs), from /proc/*/stat's parent field."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _finish(process: subprocess.Popen, timeout: float) -> tuple[int, str, str]:
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return process.returncode, stdout.decode(), stderr.decode()


@pytest.fixture
def tiny_partition(tmp_path: Path) -> Path:
    path = tmp_path / "tiny-partition.toml"
    path.write_text(TINY_PARTITION)
    return path


def test_network_fault_from_the_cli_is_applied_inside_the_namespace(tiny_partition, out_dir):  # noqa: F811
    # --no-check: a Spark check inside the namespace works (docs/measurements.md) but costs 20 s to
    # minutes on a loaded machine; the run's own exit code already says whether the fault was applied.
    code, stdout, stderr = _finish(_ordeal_run(tiny_partition, out_dir, "--no-check"), timeout=240)
    run_dir = Path(stdout.strip().splitlines()[-1])
    assert run_dir.parent == out_dir, stdout  # the path printed inside the namespace is the caller's
    summary = json.loads((run_dir / "summary.json").read_text())
    assert "network: private" in stderr, stderr[-2000:]
    assert json.loads((run_dir / "topology.json").read_text())["network_namespace"] == "private"
    rows = read_history(run_dir / "history").to_pylist()
    kinds = [r["kind"] for r in rows if r["fault_id"]]
    assert Kind.FAULT_ERROR not in kinds, [r["detail"] for r in rows if r["kind"] == Kind.FAULT_ERROR]
    assert Kind.FAULT_START in kinds and Kind.FAULT_HEAL in kinds
    assert summary["drain"]["reason"] == "quiet", summary["drain"]
    assert code == summary["exit_code"] == 0, (summary["error"], stderr[-3000:])  # not unknown


def test_no_isolated_refuses_the_network_fault_and_says_why(tiny_partition, out_dir):  # noqa: F811
    code, stdout, stderr = _finish(_ordeal_run(tiny_partition, out_dir, "--no-isolated", "--no-check"), timeout=180)
    run_dir = Path(stdout.strip().splitlines()[-1])
    assert code == 2 and "network: host (--no-isolated)" in stderr
    errors = [r["detail"] for r in read_history(run_dir / "history").to_pylist() if r["kind"] == Kind.FAULT_ERROR]
    assert errors and "namespace" in " ".join(errors), errors


def test_sigkill_of_isolated_ordeal_leaves_no_process(tiny_partition, out_dir):  # noqa: F811
    process = _ordeal_run(tiny_partition, out_dir, "--no-check")
    try:
        run_dir = _wait_for_workload(out_dir, process)
        pids = _descendants(process.pid) | _processes_mentioning(run_dir)
        # unshare, the run, 3 Redis nodes, Tansu, its S3 store, the broker: host PIDs, seen from outside
        assert len(pids) >= 7, pids
    finally:
        _sigkill(process)
    leftover = _leftovers_killed(pids, run_dir)
    assert not leftover, f"processes outlived the killed isolated run: {leftover}"


def test_sigterm_reaches_the_isolated_run(tiny_partition, out_dir):  # noqa: F811
    process = _ordeal_run(tiny_partition, out_dir, "--no-check")
    try:
        run_dir = _wait_for_workload(out_dir, process)
        os.kill(process.pid, signal.SIGTERM)
        code = process.wait(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert code == 2
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["history_complete"] is False and "interrupted" in summary["error"]
    assert not _processes_mentioning(run_dir)


def _net_namespace(pid: int | str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def _holders_of(namespaces: set[str]) -> set[int]:
    """Every live process (host PIDs) whose network namespace is one of these."""
    return {int(entry.name) for entry in Path("/proc").iterdir()
            if entry.name.isdigit() and _net_namespace(entry.name) in namespaces}


def test_replay_runs_in_its_own_namespace_and_leaves_no_process_nor_namespace(tiny_partition, out_dir, tmp_path):  # noqa: F811
    """`ordeal replay` isolates itself like `ordeal run`: its run happens in a network namespace that is not
    the caller's (the partition is applied there), and when it ends no process and so no namespace is left."""
    from contracts.scenario import load_scenario
    from properties.generate import make_plan

    stored = tmp_path / "stored"  # a replayable directory: scenario.toml + plan.json, never checked
    stored.mkdir()
    (stored / "scenario.toml").write_text(TINY_PARTITION)
    (stored / "plan.json").write_text(make_plan(load_scenario(tiny_partition), 3).to_json())
    ours = _net_namespace("self")
    stdout_path, stderr_path = tmp_path / "stdout", tmp_path / "stderr"
    with stdout_path.open("wb") as stdout, stderr_path.open("wb") as stderr:
        process = subprocess.Popen([sys.executable, "-m", "ordeal.cli", "replay", str(stored), "--out", str(out_dir),
                                    "--no-check"], cwd=ROOT, env=_users_environment(), stdout=stdout, stderr=stderr,
                                   start_new_session=True)
    seen_pids: set[int] = set()
    seen_namespaces: set[str] = set()
    try:
        deadline = time.monotonic() + 240
        while process.poll() is None and time.monotonic() < deadline:
            # watch the replay's processes: where they live is the proof of isolation
            for pid in _descendants(process.pid):
                namespace = _net_namespace(pid)
                if namespace is not None:
                    seen_pids.add(pid)
                    seen_namespaces.add(namespace)
            time.sleep(0.3)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    output, errors = stdout_path.read_text(), stderr_path.read_text()
    assert process.returncode == 0, (output, errors[-3000:])
    assert "network: private" in errors, errors[-2000:]
    private = seen_namespaces - {ours}
    assert private, f"every process of the replay ran in the caller's namespace {ours}"
    run_dir = next(out_dir.iterdir())
    assert f"new run:   {run_dir}" in output, output
    assert json.loads((run_dir / "topology.json").read_text())["network_namespace"] == "private"
    kinds = [r["kind"] for r in read_history(run_dir / "history").to_pylist() if r["fault_id"]]
    assert Kind.FAULT_ERROR not in kinds and Kind.FAULT_HEAL in kinds, kinds  # the partition really applied
    leftover = _wait_gone({pid for pid in seen_pids if _net_namespace(pid) in private}) | _holders_of(private)
    leftover |= _processes_mentioning(run_dir)
    for pid in leftover:  # never leave them behind, even when the test fails
        os.kill(pid, signal.SIGKILL)
    assert not leftover, f"the replay left processes (and so its namespace {private}) behind: {leftover}"
