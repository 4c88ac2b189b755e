"""power_loss on a black-box target: a real Mosquitto (scenarios/mosquitto-power-loss.toml: persistence with an
autosave every second) whose data directory the harness mounts on lazyfs before its start.

Mosquitto fsyncs its database before renaming it into place (src/persist_write.c), so a power loss after a save
keeps the saved session and its queued message: the restarted Mosquitto presents the session and delivers the
message.  The planted twin runs the same on a lazyfs whose fsync does nothing (harness/lazyfs/ ``ignore_fsync``):
the save is then never on the disk, the power loss drops it (bytes_dropped > 0) and the restarted Mosquitto knows
neither the session nor the message.  Both end with nothing mounted and nothing of Mosquitto running.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from support.capabilities import missing_capability

from contracts.scenario import find_scenario, load_scenario
from faults.base import FaultContext
from faults.catalog import build_fault, external_refusal, validate_spec
from harness.external_target import ExternalTarget, TargetError
from harness.history import HistoryRecorder
from harness.lazyfs import mount_points
from harness.power import PowerMounts, harness_data_dirs
from properties.plan import FaultSlot

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

TOPIC = "ordeal/power/1"


def _require() -> None:
    if os.geteuid() != 0:
        missing_capability("power_loss on Mosquitto needs root (lazyfs with allow_other; Mosquitto drops to its user)")
    if not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None:
        missing_capability("FUSE (/dev/fuse, fusermount3) is not available")
    if shutil.which("mosquitto") is None:
        missing_capability("mosquitto is not installed: run scripts/bootstrap.sh")


def _client(target: ExternalTarget, client_id: str) -> tuple[mqtt.Client, dict]:
    seen: dict = {"messages": [], "session_present": None, "connected": threading.Event()}
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=False,
                         protocol=mqtt.MQTTv311)

    def on_connect(_client, _userdata, flags, reason_code, _properties):
        seen["session_present"] = flags.session_present
        seen["rc"] = reason_code
        seen["connected"].set()

    client.on_connect = on_connect
    client.on_message = lambda _c, _u, message: seen["messages"].append(message.payload)
    client.connect(target.host, target.port, keepalive=30)
    client.loop_start()
    assert seen["connected"].wait(10), f"{client_id}: no CONNACK from {target.host}:{target.port}"
    return client, seen


def _close(client: mqtt.Client) -> None:
    client.disconnect()
    client.loop_stop()


def _power_loss_run(ignore_fsync: bool, monkeypatch: pytest.MonkeyPatch) -> dict:
    """Start Mosquitto on lazyfs, queue a message for an offline persistent session, wait for a save, power loss,
    heal; return what the fault saw and what the restarted Mosquitto presented."""
    if ignore_fsync:  # the planted failure: the mount's fsync does nothing
        start = PowerMounts.start.__func__
        monkeypatch.setattr(PowerMounts, "start", classmethod(
            lambda cls, nodes, run_dir, **_: start(cls, nodes, run_dir, ignore_fsync=True)))
    out = Path(tempfile.mkdtemp(prefix="ordeal-power-ext-", dir="/tmp"))
    out.chmod(0o755)  # Mosquitto drops root: it must reach its data directory
    run_dir = out / "run"
    run_dir.mkdir()
    scenario = load_scenario(find_scenario("mosquitto-power-loss"))
    recorder = HistoryRecorder(run_dir / "history", run_id="power-external")
    target = ExternalTarget(scenario, run_dir, recorder)
    slot = FaultSlot("p1", "power_loss", "node:mosquitto", 1.0, 2.0, {"wait_promotion": True})
    plan = dataclasses.replace(_empty_plan(scenario), faults=(slot,))
    result: dict = {}
    try:
        target.prepare()
        notes = target.prepare_power(plan)
        assert notes and "mosquitto" in notes[0], notes
        target.start()
        node = target.node
        mount = node.lazyfs
        assert str(node.data_dir) in mount_points(), "the data directory is not a lazyfs mount"
        subscriber, _ = _client(target, "power-sub")
        subscriber.subscribe(TOPIC, qos=1)
        time.sleep(0.3)
        _close(subscriber)  # offline: what is published now waits in its session
        publisher, _ = _client(target, "power-pub")
        publisher.publish(TOPIC, b"saved before the power loss", qos=1).wait_for_publish(10)
        _close(publisher)
        fsyncs = mount.stats()["fsyncs"]
        deadline = time.monotonic() + 10  # Mosquitto's next save (autosave_interval 1: within about 2 s)
        while mount.stats()["fsyncs"] <= fsyncs and time.monotonic() < deadline:
            time.sleep(0.1)
        result["saved"] = mount.stats()["fsyncs"] > fsyncs
        ctx = FaultContext(topology=target.topology, record=lambda kind, **columns: recorder.record(kind, **columns),
                           ready_timeout_s=15)
        fault = build_fault(validate_spec({"id": "p1", "kind": "power_loss", "target": "node:mosquitto"}))
        applied = fault.apply(ctx)
        result["applied"] = applied
        result["dropped"] = next(c for c in applied.checks if c.what == "unsynced writes dropped").observed
        result["healed"] = fault.heal(ctx)
        result["same_mount"] = node.lazyfs is mount and str(node.data_dir) in mount_points()
        subscriber, seen = _client(target, "power-sub")
        time.sleep(1.0)
        _close(subscriber)
        result["session_present"], result["messages"] = seen["session_present"], list(seen["messages"])
        result["pid"] = node.pid
    finally:
        try:
            target.stop()
        finally:
            recorder.close()
            result["mounted_after"] = [p for p in mount_points() if p.startswith(str(out))]
            result["alive_after"] = [n.name for n in target.nodes if n.is_alive()]
            shutil.rmtree(out, ignore_errors=True)
    return result


def _empty_plan(scenario):
    from properties.generate import make_plan

    return dataclasses.replace(make_plan(scenario, 1), faults=())


@pytest.mark.parametrize("ignore_fsync", [False, True], ids=["fsync", "planted-ignore-fsync"])
def test_power_loss_on_mosquitto(ignore_fsync: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    _require()
    began = time.monotonic()
    run = _power_loss_run(ignore_fsync, monkeypatch)
    assert run["applied"].bit, run["applied"].to_dict()
    assert run["healed"].bit, run["healed"].to_dict()
    assert run["saved"], "Mosquitto did not save (fsync) its database within 10 s of the publish"
    assert run["same_mount"], "after the heal Mosquitto's data directory is no longer the same lazyfs mount"
    assert run["mounted_after"] == [] and run["alive_after"] == [], run
    if ignore_fsync:
        # Nothing was ever fsynced, so the saves are what the power loss drops: the fault bites.
        assert run["dropped"]["bytes_dropped"] > 0, run["dropped"]
        assert not run["session_present"] and run["messages"] == [], run
    else:
        # Its save was fsynced before the rename: a power loss between two saves drops no byte of it (0 is the
        # expected count unless the loss hits a save midway), and the session and its message come back.
        assert run["dropped"]["unsynced_bytes_after"] == 0, run["dropped"]
        assert run["session_present"] and run["messages"] == [b"saved before the power loss"], run
    assert time.monotonic() - began < 60


def test_power_loss_refused_for_a_node_that_keeps_its_data_elsewhere(tmp_path: Path) -> None:
    """A target whose start argv / config never names {data_dir} keeps its data where the harness has no mount:
    refused before anything starts, naming the node and the fix."""
    scenario = load_scenario(find_scenario("mosquitto-power-loss"))
    config = scenario.target.config_text.replace("persistence_location {data_dir}/", "persistence_location /var/lib/x/")
    elsewhere = dataclasses.replace(scenario, target=dataclasses.replace(scenario.target, config_text=config))
    assert harness_data_dirs(elsewhere.target.node_specs(), config) == {"mosquitto": False}
    assert harness_data_dirs(scenario.target.node_specs(), scenario.target.config_text) == {"mosquitto": True}
    why = external_refusal("power_loss", ("node:mosquitto",), [{}], (("mosquitto", "broker", False),))
    assert "does not keep its data in the directory the harness gives it" in why and "{data_dir}" in why
    assert external_refusal("power_loss", ("node:mosquitto",), [{}], (("mosquitto", "broker", True),)) == ""
    recorder = HistoryRecorder(tmp_path / "history", run_id="power-refused")
    try:
        target = ExternalTarget(elsewhere, tmp_path, recorder)
        slot = FaultSlot("p1", "power_loss", "node:mosquitto", 1.0, 2.0, {})
        with pytest.raises(TargetError, match="node 'mosquitto' does not keep its data"):
            target.prepare_power(dataclasses.replace(_empty_plan(elsewhere), faults=(slot,)))
    finally:
        recorder.close()
