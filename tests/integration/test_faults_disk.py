"""Disk faults against a real Redis 7 node (cluster mode, every slot its own, appendonly yes, appendfsync
everysec) whose data dir is a size-limited tmpfs in a mount namespace of the test's own (harness/disk.py):
disk_full bites (MISCONF on writes, the AOF write errors in Redis' log) and heals (Redis writes again);
file_truncate and file_bitflip of the AOF, and what Redis does at the restart; nothing left mounted on the
host, nothing left running."""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import redis
from support.capabilities import missing_capability
from support.scenarios import durable_reference

from faults.base import FaultContext
from faults.catalog import build_fault, validate_spec
from faults.disk import FILL_NAME
from harness import reaper
from harness.disk import DiskHolder
from harness.local.redis_processes import RedisNode
from harness.node import NodeError

REDIS = shutil.which("redis-server")
FS_BYTES = 8 << 20


def _require() -> None:
    if REDIS is None:
        missing_capability("redis-server not installed: run scripts/bootstrap.sh")
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("nsenter"):
        missing_capability("disk faults need root, unshare and nsenter (a tmpfs in a mount namespace)")


def _free_port() -> int:
    """A free port Redis Cluster accepts (its bus is port + 10000, so at most 55535)."""
    import socket

    for _ in range(200):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port <= 55535:
            return port
    raise AssertionError("no free port <= 55535")


def _mounted(marker: str) -> list[str]:
    return [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if marker in line]


def _cluster_ok(client: redis.Redis, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while "cluster_state:ok" not in str(client.execute_command("CLUSTER", "INFO")):
        if time.monotonic() > deadline:
            raise AssertionError("single-node cluster not ok")
        time.sleep(0.05)


@contextlib.contextmanager
def _redis_on_tmpfs(tmp_path: Path, appendfsync: str = "everysec"):
    """A Redis node on an 8 MiB tmpfs, in a stand-in topology the faults read (redis_nodes, nodes())."""
    _require()
    run = tmp_path / "run"
    node = RedisNode("redis-a", "127.0.0.1", _free_port(), Path(REDIS), run_dir=run, appendfsync=appendfsync,
                     node_timeout_ms=2000)
    holder = DiskHolder.start({node.data_dir: FS_BYTES}, run / "logs" / "disk-holder.log")
    node.disk = holder
    try:
        node.start()
        node.wait_ready(10)
        client = node.client()
        client.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
        _cluster_ok(client)
        topology = SimpleNamespace(redis_nodes=[node], brokers=[], kafka=None, storage=None, config=None,
                                   nodes=lambda: [node])
        yield SimpleNamespace(node=node, holder=holder, topology=topology, client=client)
    finally:
        node.kill()
        holder.stop()
    # Nothing stays mounted on the host, nothing stays running.
    assert _mounted(str(node.data_dir)) == []
    assert holder.process.poll() is not None and holder.pid not in reaper.tracked()
    assert node.pid is None


@pytest.fixture
def redis_on_tmpfs(tmp_path):
    with _redis_on_tmpfs(tmp_path) as redis_node:
        yield redis_node


def _back(node: RedisNode) -> redis.Redis:
    """The restarted node's client, once its one-node cluster is ok again (it reloads nodes.conf)."""
    client = node.client()
    _cluster_ok(client)
    return client


def _ctx(topology) -> FaultContext:
    return FaultContext(topology=topology, seed=7, effect_timeout_s=10.0, ready_timeout_s=10.0)


def _checks(evidence) -> dict:
    return {check.what: check for check in evidence.checks}


def test_the_tmpfs_lives_in_the_namespace_only_and_survives_a_kill(redis_on_tmpfs):
    node, holder, client = redis_on_tmpfs.node, redis_on_tmpfs.holder, redis_on_tmpfs.client
    assert _mounted(str(node.data_dir)) == []  # not on the host
    inside = Path(f"/proc/{node.pid}/mountinfo").read_text()
    assert str(node.data_dir) in inside and "tmpfs" in inside
    assert holder.space(node.data_dir).size == FS_BYTES
    client.set("kept", "1")
    time.sleep(1.2)  # appendfsync everysec
    node.kill()
    node.start()
    node.wait_ready(10)
    assert _back(node).get("kept") == "1"  # the AOF on the tmpfs survived the restart


def test_disk_full_bites_and_heals(redis_on_tmpfs):
    node, client, ctx = redis_on_tmpfs.node, redis_on_tmpfs.client, _ctx(redis_on_tmpfs.topology)
    client.set("before", "x")
    fault = build_fault(validate_spec({"id": "full-1", "kind": "disk_full", "target": "node:redis-a"}))
    applied = fault.apply(ctx)
    assert applied.bit, applied.to_dict()
    full = _checks(applied)["data directory full"].observed
    assert full["ended"] == "ENOSPC" and full["free_after_bytes"] == 0 and full["filled_bytes"] > FS_BYTES // 2
    refused = None
    for attempt in range(20):  # the first write fails in Redis' AOF flush; the next ones are refused
        try:
            client.set(f"during-{attempt}", "y" * 4096)
        except redis.ResponseError as error:
            refused = str(error)
            break
        time.sleep(0.1)
    assert refused is not None and refused.startswith("MISCONF"), refused
    assert "No space left on device" in refused
    healed = fault.heal(ctx)
    assert healed.bit, healed.to_dict()
    met = _checks(healed)["node met write errors"].observed
    assert met["persistence"]["aof_last_write_status"] == "err"
    assert met["lines"], met
    assert not (node.data_view / FILL_NAME).exists()
    assert client.set("after", "z") is True


def test_disk_full_with_appendfsync_always_redis_exits_and_the_heal_starts_it(tmp_path):
    with _redis_on_tmpfs(tmp_path, "always") as redis_node:
        node, client, ctx = redis_node.node, redis_node.client, _ctx(redis_node.topology)
        client.set("before", "x")
        fault = build_fault(validate_spec({"id": "full-3", "kind": "disk_full", "target": "node:redis-a"}))
        assert fault.apply(ctx).bit
        with pytest.raises(redis.ConnectionError):  # Redis exits on the failed AOF write
            client.set("during", "y" * 4096)
        assert not node.is_alive()
        healed = fault.heal(ctx)
        assert healed.bit, healed.to_dict()
        met = _checks(healed)["node met write errors"].observed
        assert met["alive"] is False and "aof_exit" in met["counts"], met
        assert _checks(healed)["redis writes again"].observed["restarted"] is True
        back = _back(node)
        assert back.get("before") == "x" and back.get("during") is None
        assert back.set("after", "z") is True


def test_disk_full_refuses_a_node_not_on_a_size_limited_fs(redis_on_tmpfs):
    from faults.base import FaultNotApplicable

    node = redis_on_tmpfs.node
    node.disk = None  # as if the run had not prepared it
    try:
        fault = build_fault(validate_spec({"id": "full-2", "kind": "disk_full", "target": "node:redis-a"}))
        with pytest.raises(FaultNotApplicable, match="not on a size-limited file system"):
            fault.apply(_ctx(redis_on_tmpfs.topology))
    finally:
        node.disk = redis_on_tmpfs.holder


def _write_some(client: redis.Redis, count: int = 200) -> None:
    for index in range(count):
        client.set(f"key-{index:04d}", f"value-{index}")
    time.sleep(1.2)  # appendfsync everysec: on disk before the SIGKILL


def test_file_truncate_of_the_aof(redis_on_tmpfs):
    node, client, ctx = redis_on_tmpfs.node, redis_on_tmpfs.client, _ctx(redis_on_tmpfs.topology)
    _write_some(client)
    fault = build_fault(validate_spec({"id": "cut-1", "kind": "file_truncate", "target": "node:redis-a",
                                       "params": {"drop_bytes": 7}}))
    applied = fault.apply(ctx)
    assert applied.bit, applied.to_dict()
    checks = _checks(applied)
    cut = checks["file truncated"].observed
    assert cut["file"] == "appendonlydir/appendonly.aof.1.incr.aof" and cut["size_after"] == cut["size_before"] - 7
    restarted = checks["node restarted on the damaged file"].observed
    # Redis 7.0 with aof-load-truncated yes: loads up to the last whole command, says so, cuts the file.
    assert restarted["came_back"] is True, restarted
    assert "truncated_loaded" in restarted["counts"], restarted
    after = _back(node)
    values = [after.get(f"key-{index:04d}") for index in range(200)]
    assert values[:199] == [f"value-{index}" for index in range(199)]
    assert values[199] is None  # the cut command is lost
    healed = fault.heal(ctx)
    assert healed.bit, healed.to_dict()


def test_file_bitflip_of_the_aof_redis_refuses_then_repair(redis_on_tmpfs):
    node, client, ctx = redis_on_tmpfs.node, redis_on_tmpfs.client, _ctx(redis_on_tmpfs.topology)
    _write_some(client)
    spec = {"id": "flip-1", "kind": "file_bitflip", "target": "node:redis-a",
            "params": {"flips": 4, "range_start": 0.4, "range_end": 0.6}}
    fault = build_fault(validate_spec(spec))
    applied = fault.apply(ctx)
    assert applied.bit, applied.to_dict()
    checks = _checks(applied)
    flipped = checks["bits flipped"].observed
    assert len(flipped["flipped"]) == 4
    size = flipped["size"]
    assert all(0.4 * size - 1 <= f["offset"] < 0.6 * size + 1 for f in flipped["flipped"])
    restarted = checks["node restarted on the damaged file"].observed
    assert restarted["came_back"] is False, restarted  # Redis refuses an AOF it cannot parse
    assert "bad_format" in restarted["counts"] or "unexpected_eof" in restarted["counts"], restarted
    assert not node.is_alive()
    healed = fault.heal(ctx)
    assert healed.bit, healed.to_dict()
    repaired = _checks(healed)["node up"].observed["repaired"]
    assert repaired["repair"] == "redis-check-aof" and repaired["done"] is True, repaired
    after = _back(node)
    assert after.get("key-0000") == "value-0"  # what came before the damage is still there
    assert 0 < after.dbsize() < 200  # redis-check-aof cut the AOF at the first bad command: the rest is gone


def test_file_bitflip_without_repair_reports_the_node_down(redis_on_tmpfs):
    node, client, ctx = redis_on_tmpfs.node, redis_on_tmpfs.client, _ctx(redis_on_tmpfs.topology)
    _write_some(client, 50)
    fault = build_fault(validate_spec({"id": "flip-2", "kind": "file_bitflip", "target": "node:redis-a",
                                       "params": {"flips": 8, "range_start": 0.3, "range_end": 0.5,
                                                  "repair": "none"}}))
    fault.apply(ctx)
    healed = fault.heal(ctx)
    assert not healed.bit
    assert "error" in _checks(healed)["node up"].observed
    with pytest.raises(NodeError):
        node.wait_ready(1)


def test_local_topology_puts_each_redis_data_dir_on_its_own_tmpfs_and_leaves_nothing(tmp_path):
    """What a run with a disk_full fault gets (ReferenceTarget.prepare_disks -> LocalTopology.disk_limits):
    each Redis node in the holder's namespace on a tmpfs of its own; after stop nothing mounted, no holder."""
    _require()
    from harness.local.host_topology import LocalTopology
    from harness.topology_config import TopologyConfig

    config = TopologyConfig(redis_masters=3, redis_replicas_per_master=0, kafka_storage="none", broker_nodes=0)
    topology = LocalTopology(config, tmp_path / "run", address_mode="loopback")
    topology.disk_limits = {"redis": FS_BYTES}
    try:
        topology.start()
        holder = topology.disk_holder
        assert holder is not None and holder.alive()
        for node in topology.redis_nodes:
            assert node.disk is holder
            assert os.readlink(f"/proc/{node.pid}/ns/mnt") == os.readlink(holder.mount_ns())
            assert os.readlink(f"/proc/{node.pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt")
            assert holder.space(node.data_dir).size == FS_BYTES
            assert (node.data_view / "appendonlydir").is_dir()
            assert not (node.data_dir / "appendonlydir").exists()  # the host directory under the tmpfs stays empty
        assert _mounted(str(tmp_path)) == []
    finally:
        topology.stop()
    assert topology.disk_holder is None and holder.process.poll() is not None
    assert holder.pid not in reaper.tracked()
    assert _mounted(str(tmp_path)) == []


def test_a_killed_harness_leaves_no_holder_no_node_and_no_mount(tmp_path):
    """SIGKILL of the process that started them (no Python teardown runs): PDEATHSIG ends the holder and the
    node in its namespace, and the namespace with its tmpfs goes with them."""
    _require()
    import signal
    import subprocess
    import sys

    script = f"""
import sys, time
from pathlib import Path
from harness.disk import DiskHolder
from harness.node import ProcessNode
data = Path({str(tmp_path / "data")!r})
holder = DiskHolder.start({{data: {FS_BYTES}}}, Path({str(tmp_path / "holder.log")!r}))
node = ProcessNode("sleeper", "redis", "127.0.0.1", 1, ["sh", "-c", "echo x > f && exec sleep 60"],
                   log_path=Path({str(tmp_path / "node.log")!r}), data_dir=data)
node.disk = holder
node.start()
time.sleep(0.3)
print(holder.pid, node.pid, flush=True)
time.sleep(60)
"""
    harness = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                               cwd=Path(__file__).resolve().parents[2])
    try:
        holder_pid, node_pid = map(int, harness.stdout.readline().split())
        assert Path(f"/proc/{node_pid}/root{tmp_path / 'data' / 'f'}").read_text() == "x\n"  # on the tmpfs
        assert not (tmp_path / "data" / "f").exists()
    finally:
        harness.send_signal(signal.SIGKILL)
        harness.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and (Path(f"/proc/{holder_pid}").exists() or Path(f"/proc/{node_pid}").exists()):
        time.sleep(0.05)
    for pid in (holder_pid, node_pid):  # gone, or a zombie of no one's (reparented and reaped by init)
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] if Path(f"/proc/{pid}").exists() else None
        assert state in (None, "Z"), (pid, state)
    assert _mounted(str(tmp_path)) == []


RUN_SCENARIO = """\
[scenario]
name = "disk-full-run"
description = "disk_full of the Redis master owning a subscriber's slot, under P2P load"
tier = "smoke"
duration_s = 10
drain_quiet_s = 2
drain_timeout_s = 60

""" + durable_reference() + """[workload]
pattern = "p2p"
qos_mix = { qos1 = 1 }
protocol_mix = { mqtt311 = 1 }
pairs = 2
rate_per_publisher = 5

[faults]
mix = { disk_full = 1 }
targets = { disk_full = ["redis-master-of:{subscriber}"] }
params = { disk_full = { fs_size_mb = 16 } }
quiet_s = [2, 3]
duration_s = [3, 4]
tail_s = 2
max_faults = 1
"""


def test_a_run_with_disk_full_prepares_the_tmpfs_bites_heals_and_leaves_nothing(tmp_path):
    """The whole path: the plan's disk_full -> ReferenceTarget.prepare_disks -> every Redis node on a 16 MiB
    tmpfs in the run's holder namespace -> the nemesis fills the target's, the broker's writes meet MISCONF, the
    heal frees it; nothing mounted, no holder left."""
    _require()
    import json

    from harness.history import read_history
    from harness.run import run_scenario

    path = tmp_path / "disk-full-run.toml"
    path.write_text(RUN_SCENARIO)
    before = set(reaper.tracked())  # other tests' topologies may still run (module and session fixtures)
    result = run_scenario(path, 1, tmp_path / "runs", check=False)
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert any("16 MiB tmpfs" in note for note in summary.get("notes", [])), summary.get("notes")
    assert "disk_holder" in json.loads((result.run_dir / "topology.json").read_text())
    rows = read_history(result.run_dir / "history").to_pylist()
    evidence = {json.loads(r["detail"])["stage"]: json.loads(r["detail"]) for r in rows
                if r["kind"] == "fault_evidence" and r["fault_kind"] == "disk_full"}
    assert set(evidence) == {"apply", "heal"}, [r for r in rows if r["kind"] == "fault_error"]
    assert evidence["apply"]["bit"] and evidence["heal"]["bit"], evidence
    checks = {c["what"]: c["observed"] for c in evidence["heal"]["checks"]}
    assert checks["node met write errors"]["persistence"]["aof_last_write_status"] == "err"
    broker_log = (result.run_dir / "logs" / "broker-1.log").read_text()
    assert "MISCONF Errors writing to the AOF file: No space left on device" in broker_log
    assert _mounted(str(tmp_path)) == []
    assert not set(reaper.tracked()) - before, set(reaper.tracked()) - before
