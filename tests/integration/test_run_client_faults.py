"""Client faults played by the executor against a real broker (Debian's Mosquitto: starts in milliseconds
and logs how each client left).  The evidence is checked against what the broker itself saw: its log line
for the departure (no DISCONNECT = "closed its connection" / "Socket error"; DISCONNECT = "disconnected")
and its own TCP table (psutil on the Mosquitto process: the client's old port no longer connected)."""

from __future__ import annotations

import functools
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from contracts.history_schema import Kind
from harness.executor import Executor
from harness.history import HistoryRecorder, read_history
from properties.plan import (
    CONNECT,
    DISCONNECT,
    PUBLISHER,
    SUBSCRIBER,
    ClientPlan,
    Plan,
    PublishPlan,
    SubscriberAction,
    Subscription,
)

pytestmark = pytest.mark.integration
from faults import catalog  # noqa: E402
from faults.base import FaultNotApplicable  # noqa: E402

MOSQUITTO = shutil.which("mosquitto")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def mosquitto(tmp_path: Path):
    """A Mosquitto on a free loopback port, logging every connection event to a file; killed by PID."""
    if MOSQUITTO is None:
        pytest.fail("mosquitto is not installed: run scripts/bootstrap.sh (as root it installs it with apt-get)")
    port = free_port()
    config = tmp_path / "mosquitto.conf"
    log = tmp_path / "mosquitto.log"
    # user root: stay root (the log file lives in the test's private temp directory); the log file is
    # written line by line, where stdout to a file would be buffered.
    config.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\nuser root\n"
                      f"log_dest file {log}\nlog_type all\nconnection_messages true\n")
    with open(tmp_path / "mosquitto.out", "wb") as out:
        process = subprocess.Popen([MOSQUITTO, "-c", str(config)], stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("mosquitto did not start: "
                                       f"{(tmp_path / 'mosquitto.out').read_text()[-2000:]}") from None
                time.sleep(0.05)
        yield process, port, log
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def small_plan(subscribers: int) -> Plan:
    clients = [ClientPlan("test_pub_client_0_0", PUBLISHER, 4, 0, publisher_index=0)]
    clients += [ClientPlan(f"test_sub_client_{i}_0", SUBSCRIBER, 4 if i % 2 == 0 else 5, 0,
                           subscriptions=(Subscription("europe/ua/kyiv/0/+", 1),), persistent=True,
                           session_expiry_s=None if i % 2 == 0 else 600) for i in range(subscribers)]
    publishes = tuple(PublishPlan(0.1 * n, "test_pub_client_0_0", n + 1, "europe/ua/kyiv/0/0", 1, 62)
                      for n in range(5))
    connects = tuple(SubscriberAction(0.0, c.client_id, CONNECT, session_expiry_s=c.session_expiry_s)
                     for c in clients if c.role == SUBSCRIBER)
    return Plan("client-faults", 1, 1.0, tuple(clients), publishes, connects)


def spec(fault_id: str, kind: str, target: str | None, **params):
    return catalog.validate_spec({"id": fault_id, "kind": kind, "target": target, "params": params})


def broker_ports(process: subprocess.Popen) -> set[int]:
    """Remote ports of the broker's ESTABLISHED connections: the clients it still sees."""
    return {c.raddr.port for c in psutil.Process(process.pid).net_connections(kind="tcp")
            if c.raddr and c.status == psutil.CONN_ESTABLISHED}


def wait_for_log(log: Path, text: str, timeout_s: float = 5.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        content = log.read_text(errors="replace")
        if text in content:
            return content
        time.sleep(0.05)
    raise AssertionError(f"{text!r} not in the broker log:\n{log.read_text(errors='replace')[-3000:]}")


@pytest.fixture
def executor_for(tmp_path: Path, mosquitto):
    made = []

    def make(subscribers: int) -> tuple[Executor, HistoryRecorder]:
        process, port, _ = mosquitto
        recorder = HistoryRecorder(tmp_path / f"history-{len(made)}", run_id="client-faults",
                                   meta={"scenario": "client-faults", "seed": 1})
        executor = Executor(small_plan(subscribers), [("127.0.0.1", port, "mosquitto")], recorder)
        made.append((executor, recorder))
        assert executor.connect_all() == {"not_ready": []}
        return executor, recorder

    try:
        yield make
    finally:
        for executor, recorder in made:
            for close in (executor.close, functools.partial(recorder.close, reason="test finished")):
                try:
                    close()
                except Exception:  # noqa: BLE001 - already closed by the test
                    pass


@pytest.mark.parametrize("mode, departure", [("abrupt", "closed its connection"), ("clean", "disconnected")])
def test_client_flap_really_closes_the_socket_and_reconnects(executor_for, mosquitto, mode, departure):
    process, _, log = mosquitto
    executor, recorder = executor_for(1)
    player = executor.client_fault_player()
    client = "test_sub_client_0_0"
    before = broker_ports(process)
    fault = spec("f01", "client_flap", client, mode=mode)

    applied = executor.run_alongside(lambda: player(fault, "apply"))  # the loop plays it on its own thread
    assert applied.bit, applied
    observed = applied.checks[0].observed
    local_port = int(observed["local"].rsplit(":", 1)[1])
    assert local_port in before, "the evidence names the connection the broker had"
    assert observed["fd_closed"] and not observed["tcp_established"]
    content = wait_for_log(log, f"Client {client} {departure}")
    if mode == "abrupt":
        assert f"Client {client} disconnected" not in content, "an abrupt flap must not send DISCONNECT"
    deadline = time.monotonic() + 5
    while local_port in broker_ports(process) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert local_port not in broker_ports(process), "the broker still holds the client's old connection"
    assert not executor.sessions[client].want_connected, "the client stays down until the fault's end"
    executor._pump(time.monotonic() + 1.0)  # no auto-reconnect while the fault holds it
    assert executor.sessions[client].paho is None

    healed = executor.run_alongside(lambda: player(fault, "heal"))
    assert healed.bit, healed
    assert healed.checks[0].observed["session_present"] is True  # clean_start false: the session survived
    executor.close()
    recorder.close(reason="test finished")
    rows = read_history(recorder.directory).to_pylist()
    disconnects = [r for r in rows if r["kind"] == Kind.DISCONNECT and r["fault_id"] == "f01"]
    assert len(disconnects) == 1 and disconnects[0]["abrupt"] is (mode == "abrupt")
    assert disconnects[0]["initiator"] == ("harness" if mode == "abrupt" else "client")
    reconnects = [r for r in rows if r["kind"] == Kind.CONNECT and r["fault_id"] == "f01"]
    assert len(reconnects) == 1 and reconnects[0]["session_present"] is True


def test_clean_start_reconnect_shows_in_the_history(executor_for):
    executor, recorder = executor_for(1)
    player = executor.client_fault_player()
    fault = spec("f02", "client_flap", "test_sub_client_0_0", clean_start=True)
    assert executor.run_alongside(lambda: player(fault, "apply")).bit
    healed = executor.run_alongside(lambda: player(fault, "heal"))
    assert healed.bit and healed.checks[0].observed["clean_start"] is True
    assert healed.checks[0].observed["session_present"] is False  # the broker discarded the session


def test_reconnect_storm_drops_every_session_at_once(executor_for, mosquitto):
    process, _, log = mosquitto
    executor, recorder = executor_for(4)
    player = executor.client_fault_player()
    fault = spec("f03", "client_reconnect_storm", None)
    applied = executor.run_alongside(lambda: player(fault, "apply"))
    assert applied.bit and len(applied.checks) == 4
    ports = {int(c.observed["local"].rsplit(":", 1)[1]) for c in applied.checks}
    for check in applied.checks:
        wait_for_log(log, f"Client {check.observed['client']} closed its connection")
    deadline = time.monotonic() + 5
    while ports & broker_ports(process) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not ports & broker_ports(process)
    healed = executor.run_alongside(lambda: player(fault, "heal"))
    assert healed.bit and len(healed.checks) == 4
    assert all(s.connected for s in executor.subscribers)


def test_a_client_fault_that_cannot_apply_raises_never_skips(executor_for):
    executor, _ = executor_for(1)
    player = executor.client_fault_player()
    executor.sessions["test_sub_client_0_0"].disconnect(abrupt=False, why="test: offline before the fault")
    with pytest.raises(FaultNotApplicable, match="not connected at the fault's start"):
        executor.run_alongside(lambda: player(spec("f04", "client_flap", "test_sub_client_0_0"), "apply"))
    with pytest.raises(FaultNotApplicable, match="not a client of this plan"):
        executor.run_alongside(lambda: player(spec("f05", "client_flap", "nobody"), "apply"))


def test_a_client_flap_waits_for_a_client_that_is_reconnecting(executor_for):
    """chaos-mix: a flap due while its subscriber is still reconnecting after a broker-node kill is played
    once the client is back (within the client-fault timeout), not refused."""
    executor, _ = executor_for(1)
    player = executor.client_fault_player()
    session = executor.sessions["test_sub_client_0_0"]
    session.disconnect(abrupt=True, why="test: the connection is lost")
    session.want_connected = True  # as after a lost connection: the executor reconnects it after a backoff
    assert not session.connected
    applied = executor.run_alongside(lambda: player(spec("f06", "client_flap", "test_sub_client_0_0"), "apply"))
    assert applied.bit, applied
    assert applied.checks[0].observed["fd_closed"]


def test_withheld_acks_are_resent_with_dup_after_an_abrupt_drop(tmp_path, mosquitto):
    """A subscriber that withholds its PUBACKs before an abrupt drop (scenario key withhold_acks_s): the
    withheld deliveries have no delivery_ack_sent row, and the resumed session resends each of them with
    the same packet id and DUP = 1 (Mosquitto does, MQTT §4.4), which is then acknowledged."""
    _, port, _ = mosquitto
    publisher = ClientPlan("test_pub_client_0_0", PUBLISHER, 4, 0, publisher_index=0)
    subscriber = ClientPlan("test_sub_client_0_0", SUBSCRIBER, 4, 0, persistent=True,
                            subscriptions=(Subscription("europe/ua/kyiv/0/+", 1),))
    publishes = tuple(PublishPlan(0.1 * n, publisher.client_id, n + 1, "europe/ua/kyiv/0/0", 1, 62)
                      for n in range(12))
    actions = (SubscriberAction(0.0, subscriber.client_id, CONNECT),
               SubscriberAction(1.0, subscriber.client_id, DISCONNECT, abrupt=True, withhold_acks_s=0.5),
               SubscriberAction(1.6, subscriber.client_id, CONNECT))
    plan = Plan("withhold", 1, 2.0, (publisher, subscriber), publishes, actions)
    recorder = HistoryRecorder(tmp_path / "history", run_id="withhold", meta={"scenario": "withhold", "seed": 1})
    executor = Executor(plan, [("127.0.0.1", port, "mosquitto")], recorder)
    try:
        assert executor.connect_all() == {"not_ready": []}
        executor.play()
        executor._pump(time.monotonic() + 1.0)
    finally:
        executor.close()
        recorder.close(reason="test finished")
    rows = read_history(recorder.directory).to_pylist()
    first_conn = [r for r in rows if r["kind"] in (Kind.DELIVERY, Kind.DELIVERY_ACK_SENT)
                  and r["t_mono_us"] < next(d["t_mono_us"] for d in rows if d["kind"] == Kind.DISCONNECT)]
    withheld = [r for r in first_conn if r["kind"] == Kind.DELIVERY and "withheld" in (r["detail"] or "")]
    assert 2 <= len(withheld) <= 8, withheld  # ~0.5 s of a 10 msg/s stream
    acked_ids = {r["pub_seq"] for r in first_conn if r["kind"] == Kind.DELIVERY_ACK_SENT}
    assert not acked_ids & {r["pub_seq"] for r in withheld}, "a withheld delivery must have no ack row"
    assert acked_ids, "deliveries before the withholding window are acknowledged"
    for original in withheld:
        again = [r for r in rows if r["kind"] == Kind.DELIVERY and r["pub_seq"] == original["pub_seq"]
                 and r["seq"] > original["seq"]]
        assert again and again[0]["dup"] is True and again[0]["packet_id"] == original["packet_id"], again
        assert not again[0]["detail"] or "withheld" not in again[0]["detail"], "the new connection acks"
