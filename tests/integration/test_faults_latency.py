"""Link faults through the harness' toxiproxy (harness/toxiproxy/, faults/latency.py) on a real Mosquitto: the
toxiproxy-python calls Ordeal makes, served by the proxy; a latency fault's evidence (the round trip it added,
then back after heal); a paho-mqtt client's PUBACK round trip through the proxy growing by about the latency
and coming back; a reset_peer cutting the client's connection; and a timeout silencing the link."""

from __future__ import annotations

import os
import pwd
import shutil
import statistics
import threading
import time
from dataclasses import dataclass, field

import paho.mqtt.client as mqtt
import pytest
from support.capabilities import missing_capability
from support.dirs import searchable_tmp
from support.mosquitto import free_port, running_mosquitto

from faults.base import FaultContext
from faults.catalog import build_fault, validate_spec
from faults.latency import CLIENT_BROKER, LINK_ATTRIBUTE
from harness.addresses import AddressPlan
from harness.toxiproxy import route_client_links, running_toxiproxy

pytestmark = pytest.mark.integration

LATENCY_MS = 150  # per direction: the added round trip is twice this with direction "both"


@dataclass
class BrokerNode:
    """The Mosquitto as the faults see a broker node (contracts.topology.NodeHandle's members they read)."""

    name: str
    host: str
    port: int
    pid: int
    role: str = "broker"


@dataclass
class LinkTopology:
    brokers: list
    link_proxies: dict = field(default_factory=dict)


@pytest.fixture(scope="module")
def mosquitto():
    if shutil.which("mosquitto") is None:
        missing_capability("mosquitto not installed: run scripts/bootstrap.sh")
    with searchable_tmp("ordeal-latency-") as base:
        if os.geteuid() == 0:  # Mosquitto drops root to its own user
            try:
                os.chown(base, pwd.getpwnam("mosquitto").pw_uid, -1)
            except KeyError:
                pass
        port = free_port()
        (base / "mosquitto.conf").write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\n"
                                             "persistence false\nlog_dest stdout\n")
        with running_mosquitto(base / "mosquitto.conf", port) as process:
            yield BrokerNode("broker-1", "127.0.0.1", port, process.pid)


@pytest.fixture(scope="module")
def routed(mosquitto, tmp_path_factory):
    """The proxy process, with the client -> broker link of the Mosquitto routed through it."""
    with running_toxiproxy(log_path=tmp_path_factory.mktemp("toxiproxy") / "toxiproxy.log") as proxy:
        topology = LinkTopology([mosquitto])
        setattr(topology, LINK_ATTRIBUTE, route_client_links(proxy.api, [mosquitto], AddressPlan("loopback")))
        yield proxy, topology


def listen_of(topology) -> tuple[str, int]:
    host, _, port = topology.link_proxies["links"][CLIENT_BROKER]["broker-1"]["listen"].rpartition(":")
    return host, int(port)


def fault(kind: str, **params):
    return build_fault(validate_spec({"id": f"t_{kind}", "kind": kind, "target": "broker:1", "params": params}))


class Paho:
    """A paho-mqtt client through the proxy; ``puback_ms()`` times one QoS 1 PUBLISH -> PUBACK."""

    def __init__(self, host: str, port: int, client_id: str) -> None:
        self.connected, self.lost = threading.Event(), threading.Event()
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id)
        self.client.on_connect = lambda *args: self.connected.set()
        self.client.on_disconnect = lambda *args: self.lost.set()
        self.client.connect(host, port, keepalive=60)
        self.client.loop_start()
        assert self.connected.wait(5), "paho did not connect through the proxy"

    def puback_ms(self) -> float:
        mark = time.monotonic()
        info = self.client.publish("ordeal/latency", b"x", qos=1)
        info.wait_for_publish(5)
        assert info.is_published(), "no PUBACK within 5 s"
        return (time.monotonic() - mark) * 1000

    def median_ms(self, samples: int = 5) -> float:
        return statistics.median(self.puback_ms() for _ in range(samples))

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def test_toxiproxy_python_calls_against_the_proxy(routed, mosquitto):
    """The calls Ordeal makes through toxiproxy-python (faults/latency.py, harness/toxiproxy/routing.py) and the
    rest of the client's surface, against the harness' proxy."""
    import toxiproxy

    proxy_process, _topology = routed
    server = toxiproxy.Toxiproxy()
    server.update_api_consumer(proxy_process.api_host, proxy_process.api_port)
    assert server.running() and b"toxiproxy" in server.version()
    proxy = server.create(upstream=f"127.0.0.1:{mosquitto.port}", name="calls", listen="127.0.0.1:0")
    assert proxy.listen.startswith("127.0.0.1:") and not proxy.listen.endswith(":0")
    assert server.get_proxy("calls").upstream == f"127.0.0.1:{mosquitto.port}"
    with pytest.raises(toxiproxy.server.ProxyExists):
        server.create(upstream=f"127.0.0.1:{mosquitto.port}", name="calls")
    proxy.add_toxic(type="latency", attributes={"latency": 10, "jitter": 2})
    proxy.add_toxic(name="cut", type="reset_peer", stream="upstream", toxicity=0.5, attributes={"timeout": 100})
    toxics = proxy.toxics()
    assert set(toxics) == {"latency_downstream", "cut"}
    assert (toxics["cut"].stream, toxics["cut"].toxicity, toxics["cut"].attributes) == ("upstream", 0.5,
                                                                                        {"timeout": 100})
    with pytest.raises(toxiproxy.api.InvalidToxic):
        proxy.add_toxic(type="latency", attributes={"rate": 1})
    assert proxy.destroy_toxic("cut") and set(proxy.toxics()) == {"latency_downstream"}
    with proxy.down():
        assert server.get_proxy("calls").enabled is False
    assert server.get_proxy("calls").enabled is True
    assert server.reset() and proxy.toxics() == {}
    assert server.destroy(proxy) and server.get_proxy("calls") is None


def test_latency_bites_and_heals_with_the_added_round_trip_in_its_evidence(routed):
    _proxy, topology = routed
    ctx = FaultContext(topology)
    latency = fault("link_latency", latency_ms=LATENCY_MS, jitter_ms=10)
    client = Paho(*listen_of(topology), "latency-paho")
    try:
        before = client.median_ms()
        applied = latency.apply(ctx)
        during = client.median_ms(3)  # the client's connection was open before the fault: it is slowed too
        healed = latency.heal(ctx)
        after = client.median_ms()
    finally:
        client.close()
    assert applied.bit, applied.to_dict()
    added = next(check for check in applied.checks if check.what == "added round trip").observed
    expected = 2 * LATENCY_MS
    assert added["expected_added_ms"] == expected
    assert 0.6 * expected <= added["added_ms"] <= expected + 250, added
    assert healed.bit, healed.to_dict()
    # paho's PUBLISH -> PUBACK through the proxy: about the latency more, then back
    assert 0.6 * expected <= during - before <= expected + 250, (before, during)
    assert after - before < 0.3 * expected, (before, after)


def test_reset_peer_cuts_the_clients_connection(routed):
    _proxy, topology = routed
    ctx = FaultContext(topology)
    reset = fault("link_reset_peer", timeout_ms=200, direction="downstream")
    client = Paho(*listen_of(topology), "reset-paho")
    try:
        client.puback_ms()
        assert not client.lost.is_set()
        applied = reset.apply(ctx)
        assert client.lost.wait(5), "paho's connection was not cut"
        healed = reset.heal(ctx)
    finally:
        client.close()
    assert applied.bit, applied.to_dict()
    cut = next(check for check in applied.checks if check.what == "connection cut").observed
    assert cut["during"]["ended"] in ("reset", "closed"), cut
    assert healed.bit, healed.to_dict()  # a fresh connection answers again


def test_timeout_silences_the_link_and_a_quiet_twin_does_not(routed):
    _proxy, topology = routed
    ctx = FaultContext(topology)
    silence = fault("link_timeout", timeout_ms=0)
    applied = silence.apply(ctx)
    healed = silence.heal(ctx)
    assert applied.bit and healed.bit, (applied.to_dict(), healed.to_dict())
    # near miss: toxicity 0 affects no connection: the probe during the fault is answered (recorded, not
    # claimed as a bite: with toxicity below 1 the probe's connection may be one the toxic spares)
    quiet = fault("link_timeout", timeout_ms=0, toxicity=0.0)
    observed = quiet.apply(ctx)
    quiet.heal(ctx)
    check = next(check for check in observed.checks if check.what == "link silent")
    assert check.observed["during"]["answered"]
