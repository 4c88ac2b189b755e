"""The power_loss fault against a real redis-server whose data directory is a real lazyfs mount: a SET
acknowledged under ``appendfsync no`` is gone after the power loss and restart; under ``appendfsync always``
it survives.  (The first is the failure the second rules out: the same test with the setting swapped.)"""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest
import redis

from faults.base import FaultContext
from faults.catalog import build_fault, validate_spec
from harness.lazyfs import LazyFsMount, is_mounted
from harness.node import ProcessNode
from tests.support.capabilities import missing_capability

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def redis_on_lazyfs(tmp_path: Path, request: pytest.FixtureRequest):
    if not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None:
        missing_capability("FUSE (/dev/fuse, fusermount3) is not available")
    binary = shutil.which("redis-server")
    if binary is None:
        missing_capability("redis-server is not installed")
    mount = LazyFsMount(backing=tmp_path / "disk", mountpoint=tmp_path / "data", control=tmp_path / "ctl.sock",
                        log_path=tmp_path / "lazyfs.log")
    mount.start()
    port = _free_port()
    node = ProcessNode("redis-solo", "redis", "127.0.0.1", port,
                       [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(mount.mountpoint),
                        "--appendonly", "yes", "--appendfsync", request.param, "--save", ""],
                       log_path=tmp_path / "redis.log", data_dir=mount.mountpoint)
    node.lazyfs = mount
    node.start()
    try:
        node.wait_ready(15)
        yield node, request.param
    finally:
        node.kill()
        mount.stop()
        assert not is_mounted(mount.mountpoint)


@pytest.mark.parametrize("redis_on_lazyfs", ["no", "always"], indirect=True)
def test_power_loss_loses_what_redis_did_not_fsync(redis_on_lazyfs) -> None:
    node, appendfsync = redis_on_lazyfs
    client = redis.Redis(host=node.host, port=node.port, socket_timeout=5)
    assert client.set("acknowledged", "before the power loss") is True
    rows: list[tuple] = []
    ctx = FaultContext(topology=SimpleNamespace(services=[node], redis_nodes=[]),
                       record=lambda kind, **columns: rows.append((kind, columns)), ready_timeout_s=15)
    fault = build_fault(validate_spec({"id": "p1", "kind": "power_loss", "target": "node:redis-solo"}))
    applied = fault.apply(ctx)
    assert applied.bit, applied.to_dict()
    dropped = next(check for check in applied.checks if check.what == "unsynced writes dropped").observed
    healed = fault.heal(ctx)
    assert healed.bit, healed.to_dict()
    value = redis.Redis(host=node.host, port=node.port, socket_timeout=5).get("acknowledged")
    if appendfsync == "no":
        assert dropped["bytes_dropped"] > 0, dropped
        assert value is None, "an acknowledged SET never fsynced survived the power loss"
    else:
        assert value == b"before the power loss", f"a SET fsynced before its ack was lost: {dropped}"
    assert [kind for kind, _ in rows].count("node_event") >= 3  # kill, power_loss, start
