"""The hold_requests toxic of the harness' toxiproxy (harness/toxiproxy/server.py): Kafka request framing on the
upstream stream, requests with an api key (and a group prefix) held with everything after them, released in order.
The requests are the bytes aiokafka itself would write (its request structs and headers), split every way."""

from __future__ import annotations

import asyncio
import json
import random
import struct

import pytest
from aiokafka.protocol.commit import OffsetCommitRequest_v2
from aiokafka.protocol.metadata import MetadataRequest_v0

from harness.toxiproxy.server import (
    Api,
    ApiError,
    KafkaRequestHold,
    Toxic,
    parse_kafka_request,
    parse_toxic,
)

APP_GROUP = "application-persisted-msg-consumer-group-sub1"


def frame(request, correlation_id: int, client_id: str = "ordeal-broker-1") -> bytes:
    """One request as aiokafka's connection writes it (aiokafka/conn.py: size, header, body)."""
    message = request.build_request_header(correlation_id=correlation_id, client_id=client_id).encode() + \
        request.encode()
    return struct.pack(">i", len(message)) + message


def commit(correlation_id: int, group: str = APP_GROUP, offset: int = 17) -> bytes:
    return frame(OffsetCommitRequest_v2(group, -1, "", -1, [("app-topic", [(0, offset, "")])]), correlation_id)


def metadata(correlation_id: int) -> bytes:
    return frame(MetadataRequest_v0(["app-topic"]), correlation_id)


def flexible_commit(correlation_id: int, group: str) -> bytes:
    """An OffsetCommit v8 (flexible): request header v2 (client id, tagged fields: one), compact group id."""
    client = b"cli"
    header = struct.pack(">hhih", 8, 8, correlation_id, len(client)) + client + b"\x01\x05\x02ab"
    body = bytes([len(group) + 1]) + group.encode() + b"\xff\xff\xff\xff\x01\x00\x00"  # generation, member...
    return struct.pack(">i", len(header + body)) + header + body


def toxic(group_prefix: str = "", api_key: int = 8) -> Toxic:
    return parse_toxic({"type": "hold_requests", "stream": "upstream",
                        "attributes": {"api_key": api_key, "group_prefix": group_prefix}})


def feed_in_chunks(hold: KafkaRequestHold, data: bytes, sizes, wants):
    passed, newly, at = b"", [], 0
    for size in sizes:
        out, new = hold.feed(data[at:at + size], wants)
        passed += out
        newly += new
        at += size
    out, new = hold.feed(data[at:], wants)
    return passed + out, newly + new


def test_parse_a_commit_header_and_group_as_aiokafka_writes_it():
    request = parse_kafka_request(commit(41))
    assert (request.api_key, request.api_version, request.correlation_id) == (8, 2, 41)
    assert request.client_id == "ordeal-broker-1" and request.group_id == APP_GROUP
    other = parse_kafka_request(metadata(7))
    assert (other.api_key, other.correlation_id, other.group_id, other.group_unknown) == (3, 7, None, True)
    flexible = parse_kafka_request(flexible_commit(9, "application-shared-msg-consumer-group-g"))
    assert (flexible.api_version, flexible.client_id, flexible.group_id) == (
        8, "cli", "application-shared-msg-consumer-group-g")
    assert parse_kafka_request(commit(1)[:5]) is None  # the api key not in yet
    assert parse_kafka_request(commit(1)[:30]).group_id is None  # the group id not in yet


@pytest.mark.parametrize("split", ["whole", "bytes", "random"])
def test_a_commit_and_everything_after_it_is_held_then_released_in_order(split):
    stream = metadata(1) + commit(2) + metadata(3) + commit(4)
    sizes = {"whole": [], "bytes": [1] * (len(stream) - 1),
             "random": [random.Random(7).randint(1, 40) for _ in range(len(stream) // 20)]}[split]
    hold = KafkaRequestHold()
    holder = toxic()
    passed, newly = feed_in_chunks(hold, stream, sizes, holder.wants)
    assert passed == metadata(1)  # nothing of the commit passed, nor what followed it
    assert hold.holding and bytes(hold.held) == commit(2) + metadata(3) + commit(4)
    assert [(request.correlation_id, who) for request, who in newly] == [(2, True), (4, True)]
    assert passed + hold.release() == stream
    assert not hold.holding
    after, newly = hold.feed(metadata(5), None)  # removed: the stream passes again, still framed
    assert after == metadata(5) and newly == []


def test_the_framing_is_followed_before_any_hold_so_a_toxic_added_mid_stream_finds_the_commit():
    stream = metadata(1) + commit(2, offset=3) + metadata(3)
    hold = KafkaRequestHold()
    cut = len(metadata(1)) + 9  # the toxic arrives in the middle of the commit: that commit has passed already
    passed, _ = hold.feed(stream[:cut], None)
    out, newly = hold.feed(stream[cut:] + commit(4), toxic().wants)
    assert passed + out == stream and newly[0][0].correlation_id == 4
    assert bytes(hold.held) == commit(4)


def test_a_group_prefix_holds_only_that_groups_commits():
    stream = commit(1, group="ordeal-broker-incoming") + commit(2) + metadata(3)
    hold = KafkaRequestHold()
    passed, newly = feed_in_chunks(hold, stream, [3] * 40, toxic(group_prefix="application-").wants)
    assert passed == commit(1, group="ordeal-broker-incoming")
    assert [request.group_id for request, _ in newly] == [APP_GROUP]
    assert bytes(hold.held) == commit(2) + metadata(3)


def test_other_api_keys_pass_untouched():
    stream = metadata(1) + metadata(2)
    hold = KafkaRequestHold()
    passed, newly = feed_in_chunks(hold, stream, [5, 11], toxic(api_key=8).wants)
    assert passed == stream and newly == [] and not hold.holding


def test_the_toxic_is_upstream_only_and_held_is_read_only():
    with pytest.raises(ApiError, match="stream must be 'upstream'"):
        parse_toxic({"type": "hold_requests", "attributes": {"api_key": 8}})
    with pytest.raises(ApiError, match="reported by the proxy"):
        parse_toxic({"type": "hold_requests", "stream": "upstream", "attributes": {"held": 3}})
    with pytest.raises(ApiError, match="must be a string"):
        parse_toxic({"type": "hold_requests", "stream": "upstream", "attributes": {"group_prefix": 1}})
    assert toxic().to_dict()["attributes"] == {"api_key": 8, "group_prefix": "", "held": 0}


def test_the_proxy_holds_a_commit_on_a_real_connection_and_sends_it_on_when_the_toxic_goes():
    """The proxy of harness/toxiproxy/server.py between a client socket and an upstream that records what it got."""

    async def scenario() -> None:
        got = bytearray()
        arrived = asyncio.Event()

        async def upstream(reader, writer):
            while data := await reader.read(65536):
                got.extend(data)
                arrived.set()
            writer.close()

        server = await asyncio.start_server(upstream, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        api = Api()
        try:
            await api.handle("POST", "/proxies", {"name": "kafka", "listen": "127.0.0.1:0",
                                                  "upstream": f"127.0.0.1:{port}"})
            listen = api.proxies["kafka"].listen
            host, _, proxy_port = listen.rpartition(":")
            reader, writer = await asyncio.open_connection(host, int(proxy_port))
            writer.write(metadata(1))
            await writer.drain()
            await asyncio.wait_for(arrived.wait(), 5)
            await api.handle("POST", "/proxies/kafka/toxics", {"name": "hold", "type": "hold_requests",
                                                               "stream": "upstream",
                                                               "attributes": {"group_prefix": "application-"}})
            writer.write(commit(2)[:10])
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(commit(2)[10:] + metadata(3))
            await writer.drain()
            for _ in range(100):
                status, state = await api.handle("GET", "/proxies/kafka/toxics/hold", {})
                if state["attributes"]["held"]:
                    break
                await asyncio.sleep(0.02)
            assert state["attributes"]["held"] == 1
            assert state["held_requests"][0]["group_id"] == APP_GROUP
            assert state["held_requests"][0]["correlation_id"] == 2
            json.dumps(state)  # as the API serves it
            await asyncio.sleep(0.1)
            assert bytes(got) == metadata(1)  # the commit and the request after it are held
            await api.handle("DELETE", "/proxies/kafka/toxics/hold", {})
            for _ in range(100):
                if len(got) == len(metadata(1) + commit(2) + metadata(3)):
                    break
                await asyncio.sleep(0.02)
            assert bytes(got) == metadata(1) + commit(2) + metadata(3)
            writer.close()
        finally:
            for proxy in list(api.proxies.values()):
                await proxy.stop()
            server.close()
            await server.wait_closed()

    asyncio.run(scenario())


# --- at_commit: validation at load, the link it routes ----------------------------------------------------------

SCENARIO = """\
[scenario]
name = "x"
description = "x"
duration_s = 10

[topology]
{topology}

[faults]
mix = {{ process_kill = 1 }}
targets = {{ process_kill = [{target}] }}
params = {{ process_kill = {{ at_commit = true{extra} }} }}
"""


def _scenario(target: str = '"kafka"', topology: str = "", extra: str = ""):
    from contracts.scenario import parse_scenario

    return parse_scenario(SCENARIO.format(target=target, topology=topology, extra=extra), source="s.toml")


def test_at_commit_is_checked_at_load_naming_the_key():
    import faults.catalog  # noqa: F401  (registers the kinds)
    from contracts.scenario import ScenarioError

    assert _scenario().faults.mix
    with pytest.raises(ScenarioError, match=r"targets\.process_kill.*'at_commit'.*target must be 'kafka'"):
        _scenario(target='"redis-master-of:{subscriber}"')
    with pytest.raises(ScenarioError, match=r"'at_commit' = true and 'at_stage'"):
        _scenario(extra=', at_stage = "persisted_commit"')
    with pytest.raises(ScenarioError, match=r"'at_commit' is not supported by provider 'containers'.*toxiproxy"):
        _scenario(topology='provider = "containers"')


def test_an_at_commit_fault_routes_the_broker_kafka_link():
    from faults.catalog import validate_spec
    from faults.commit_hold import at_commit_links

    spec = validate_spec({"id": "f1", "kind": "process_pause", "target": "kafka", "params": {"at_commit": True}})
    assert spec.params == {"at_commit": True, "commit_group_prefix": "application-", "commit_wait_s": 5.0}
    assert at_commit_links([{"kind": "process_pause", "params": dict(spec.params)}]) == {"broker-kafka"}
    assert at_commit_links([{"kind": "process_kill", "params": {"at_commit": False}}]) == set()
