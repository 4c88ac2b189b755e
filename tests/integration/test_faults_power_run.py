"""A whole reference run with a power_loss of the Redis master owning a subscriber's slot: the plan's fault makes
the run mount a lazyfs on every Redis node's data directory (ReferenceTarget.prepare_power), the nemesis kills
the master and drops what it never fsynced, the heal starts it again on the same mount; at the end nothing is
mounted and nothing runs.

The run's Redis uses ``appendfsync no``: every AOF write since the node started is unsynced, so the drop has bytes
to lose whenever the kill comes.  Under ``everysec`` a kill that falls between a second's fsync and the next write
(a few percent of runs at this load) drops nothing, a correct outcome this test could not tell from a drop that
never happened; what ``no`` and ``always`` keep is tested on a single node in test_faults_power.py."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from support.capabilities import missing_capability
from support.scenarios import durable_reference

from harness import reaper
from harness.lazyfs import mount_points

pytestmark = pytest.mark.integration

RUN_SCENARIO = """\
[scenario]
name = "power-loss-run"
description = "power_loss of the Redis master owning a subscriber's slot, under P2P load"
tier = "smoke"
duration_s = 10
drain_quiet_s = 2
drain_timeout_s = 60

""" + durable_reference(topology='redis_appendfsync = "no"') + """[workload]
pattern = "p2p"
qos_mix = { qos1 = 1 }
protocol_mix = { mqtt311 = 1 }
pairs = 2
rate_per_publisher = 10

[faults]
mix = { power_loss = 1 }
targets = { power_loss = ["redis-master-of:{subscriber}"] }
quiet_s = [3, 4]
duration_s = [2, 3]
tail_s = 2
max_faults = 1
"""


def _require() -> None:
    if os.geteuid() != 0:
        missing_capability("a reference run with lazyfs mounts needs root (FUSE mounts, allow_other)")
    if not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None:
        missing_capability("FUSE (/dev/fuse, fusermount3) is not available")
    for binary in ("redis-server",):
        if shutil.which(binary) is None:
            missing_capability(f"{binary} is not installed")


def _ours(tmp_path) -> list[str]:
    return [point for point in mount_points() if point.startswith(str(tmp_path))]


def test_a_run_with_power_loss_mounts_lazyfs_bites_heals_and_leaves_nothing(tmp_path):
    _require()
    from harness.history import read_history
    from harness.run import run_scenario

    path = tmp_path / "power-loss-run.toml"
    path.write_text(RUN_SCENARIO)
    before = set(reaper.tracked())  # other tests' topologies may still run (module and session fixtures)
    result = run_scenario(path, 1, tmp_path / "runs", check=False)
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert any("lazyfs mount" in note for note in summary.get("notes", [])), summary.get("notes")
    described = json.loads((result.run_dir / "topology.json").read_text())
    assert len(described.get("lazyfs", {})) == 6, described.get("lazyfs")
    rows = read_history(result.run_dir / "history").to_pylist()
    evidence = {json.loads(r["detail"])["stage"]: json.loads(r["detail"]) for r in rows
                if r["kind"] == "fault_evidence" and r["fault_kind"] == "power_loss"}
    assert set(evidence) == {"apply", "heal"}, [r for r in rows if r["kind"] == "fault_error"]
    assert evidence["apply"]["bit"] and evidence["heal"]["bit"], evidence
    dropped = {c["what"]: c["observed"] for c in evidence["apply"]["checks"]}["unsynced writes dropped"]
    assert dropped["bytes_dropped"] > 0, dropped  # appendfsync no: the AOF written since the node started
    assert dropped["unsynced_bytes_after"] == 0, dropped
    assert _ours(tmp_path) == []
    assert not set(reaper.tracked()) - before, set(reaper.tracked()) - before
