"""Each broker-level defect of the catalog, switched on, visibly changes behaviour (the save-script
defects are shown in test_lua_scripts.py).  The correct behaviour each one breaks is asserted in
test_broker_flow.py, or in the same test as a control."""

from __future__ import annotations

import base64
import re
import time
import uuid

import orjson
import pytest
import test_broker_application as app
import test_broker_flow
import test_broker_will_retained
from test_broker_flow import FILTER, TOPIC, offline_backlog, payloads, reconnect
from test_broker_will_retained import dropped_with_delayed_will, retained, subscriber, will_topic

from reference_broker.defects import CATALOG

pytestmark = pytest.mark.integration
brokers = test_broker_flow.brokers  # the fixture, shared with the flow tests
will_clients = test_broker_will_retained.will_clients  # the fixture, shared with the Will tests

LUA_LEVEL = {"score_reset_at_wrap", "packet_id_wraps_to_zero", "last_packet_id_from_zset", "trim_newest",
             "trim_off_by_one", "expiry_as_milliseconds", "score_from_last_packet_id", "packet_id_skips_65535",
             "zero_expiry_breaks_save"}


def test_every_defect_has_a_focused_test():
    import test_broker_mqtt5_delivery  # the MQTT 5 delivery defects, beside the rules they break
    import test_lua_scripts

    here = {name for name in [*globals(), *dir(test_broker_mqtt5_delivery)] if name.startswith("test_defect_")}
    lua = {name for name in dir(test_lua_scripts) if name.startswith("test_defect_")}
    for defect in CATALOG:
        assert f"test_defect_{defect}" in (lua if defect in LUA_LEVEL else here), defect


def test_defect_ignore_message_expiry(brokers):
    cluster = brokers(defects=["ignore_message_expiry"])
    sub, pub = offline_backlog(cluster, 5, 0)
    pub.publish(TOPIC, b"expired", 1, expiry=1)
    cluster.wait_stored(sub.client_id, 1)
    time.sleep(2.2)
    assert reconnect(sub) is True
    got = sub.settle(0.7)
    assert payloads(got) == [b"expired"] and got[0].expiry is None   # delivered after its expiry


def test_defect_remaining_expiry_not_reduced(brokers):
    cluster = brokers(defects=["remaining_expiry_not_reduced"])
    sub, pub = offline_backlog(cluster, 5, 0)
    pub.publish(TOPIC, b"waited", 1, expiry=60)
    cluster.wait_stored(sub.client_id, 1)
    time.sleep(2.2)
    assert reconnect(sub) is True
    got = sub.settle(0.7)
    assert payloads(got) == [b"waited"] and got[0].expiry == 60


def _resend_after_reconnect(cluster):
    sub, _ = offline_backlog(cluster, 4, 3)
    cluster.wait_stored(sub.client_id, 3)
    sub.auto_ack = False
    reconnect(sub)
    first = sub.wait_for(3, timeout=30)
    assert len(first) == 3, f"first delivery incomplete: {first}"
    sub.drop()                       # no PUBACKs: all three are still owed
    sub.clear()
    sub.auto_ack = True
    reconnect(sub)
    resent = sub.wait_for(3, timeout=30)
    assert len(resent) == 3, f"redelivery incomplete: {resent}"
    return first, resent


def test_defect_no_dup_on_resend(brokers):
    first, resent = _resend_after_reconnect(brokers(defects=["no_dup_on_resend"]))
    assert [d.dup for d in first] == [False] * 3
    assert payloads(resent) == payloads(first) and [d.dup for d in resent] == [False] * 3


def test_correct_broker_sets_dup_on_resend_only(brokers):
    first, resent = _resend_after_reconnect(brokers())
    assert [d.dup for d in first] == [False] * 3
    assert payloads(resent) == payloads(first) and [d.dup for d in resent] == [True] * 3


def test_defect_dup_on_first_delivery(brokers):
    first, _ = _resend_after_reconnect(brokers(defects=["dup_on_first_delivery"]))
    assert [d.dup for d in first] == [True] * 3


def test_defect_puback_not_removing(brokers):
    cluster = brokers(defects=["puback_not_removing"])
    sub, _ = offline_backlog(cluster, 5, 3)
    cluster.wait_stored(sub.client_id, 3)
    reconnect(sub)
    assert len(sub.settle(0.5)) == 3          # received and acknowledged
    assert len(cluster.stored_ids(sub.client_id)) == 3
    sub.disconnect()
    sub.clear()
    reconnect(sub)
    assert payloads(sub.settle(0.7)) == [b"m000", b"m001", b"m002"]   # redelivered after the ack


def test_defect_session_present_always_zero(brokers):
    cluster = brokers(defects=["session_present_always_zero"])
    sub, _ = offline_backlog(cluster, 4, 2)
    cluster.wait_stored(sub.client_id, 2)
    assert reconnect(sub) is False             # the session did resume ...
    assert payloads(sub.wait_for(2)) == [b"m000", b"m001"]   # ... its backlog proves it


def test_defect_live_before_backlog(brokers):
    cluster = brokers(defects=["live_before_backlog"])
    sub, pub = offline_backlog(cluster, 5, 4)
    cluster.wait_stored(sub.client_id, 4)
    reconnect(sub)
    for i in range(2):
        pub.publish(TOPIC, b"new%d" % i, 1)
    got = payloads(sub.wait_for(6))
    assert sorted(got) == sorted([b"m000", b"m001", b"m002", b"m003", b"new0", b"new1"])
    assert got[0] == b"new0"                   # a new message overtook the whole backlog


def test_defect_stale_subscription_cache(brokers):
    cluster = brokers(defects=["stale_subscription_cache"])
    pub = cluster.probe(version=5)
    pub.connect(clean=True)
    pub.publish(TOPIC, b"warm-up", 1)          # the fan-out loads its cache here
    time.sleep(0.5)
    sub = cluster.probe(version=5)
    sub.connect(clean=False, session_expiry=600)
    sub.subscribe(FILTER, 1)
    pub.publish(TOPIC, b"after-suback", 1)
    assert sub.settle(1.0) == []               # published after the SUBACK, never delivered


@pytest.mark.parametrize("defect", [False, True], ids=["correct", "commit_before_save"])
def test_defect_commit_before_save(brokers, defect):
    """A node killed while the save keeps failing: the correct broker has not committed, so the next
    node saves the batch again; with the defect the offsets were committed first and the batch is lost."""
    cluster = brokers(defects=["commit_before_save"] if defect else [],
                      persisted_failure_strategy="retry_forever", persisted_failure_backoff_s=0.2)
    sub, pub = offline_backlog(cluster, 5, 0)
    blocker = cluster.key(sub.client_id, "messages")
    cluster.redis.set(blocker, "not-a-zset")   # every save of this client fails with WRONGTYPE
    for i in range(3):
        pub.publish(TOPIC, b"k%d" % i, 1)
    pub.drop()
    time.sleep(1.5)                            # fan-out done, saves failing and retried
    cluster.nodes[0].kill()
    cluster.redis.delete(blocker)
    cluster.start(1)                           # a fresh node takes the partitions once the lease ran out
    moved = cluster.probe(sub.client_id, node=1, version=5)
    assert moved.connect(clean=False, session_expiry=3600) is True
    got = payloads(moved.settle(1.0, timeout=15) if defect else moved.wait_for(3, timeout=15))
    if defect:
        assert got == []
    else:
        assert got == [b"k0", b"k1", b"k2"]


@pytest.mark.parametrize("defect", [False, True], ids=["correct", "discarded_queue_kept"])
def test_defect_discarded_queue_kept(brokers, defect):
    """A persistent session leaves a backlog; the client comes back with a clean start (MQTT 5, expiry > 0:
    the new session is persistent too).  The old queue must die with the old session; with the defect it is
    delivered to the new one right after CONNACK, before any SUBSCRIBE."""
    cluster = brokers(defects=["discarded_queue_kept"] if defect else [])
    sub, _ = offline_backlog(cluster, 5, 3)
    cluster.wait_stored(sub.client_id, 3)
    assert sub.connect(clean=True, session_expiry=3600) is False   # a new session, no subscription
    got = sub.settle(1.0)
    assert payloads(got) == ([b"m000", b"m001", b"m002"] if defect else [])


@pytest.mark.parametrize("defect", [False, True], ids=["correct", "backlog_sent_twice"])
def test_defect_backlog_sent_twice(brokers, defect):
    cluster = brokers(defects=["backlog_sent_twice"] if defect else [])
    sub, _ = offline_backlog(cluster, 5, 3)
    cluster.wait_stored(sub.client_id, 3)
    assert reconnect(sub) is True
    got = sub.settle(1.0)
    expected = [b"m000", b"m001", b"m002"]
    # one connection: with the defect each backlog message arrives twice, both as a first delivery (DUP 0)
    assert payloads(got) == (expected * 2 if defect else expected)
    assert [d.dup for d in got] == [False] * len(got)
    assert len({d.packet_id for d in got}) == 3


@pytest.mark.parametrize("defect", [False, True], ids=["correct", "resend_within_connection"])
def test_defect_resend_within_connection(brokers, defect):
    cluster = brokers(defects=["resend_within_connection"] if defect else [])
    sub, _ = offline_backlog(cluster, 5, 2)
    cluster.wait_stored(sub.client_id, 2)
    sub.auto_ack = False                       # a slow subscriber: no PUBACK for a while
    assert reconnect(sub) is True
    got = sub.settle(2.5, timeout=10)
    first = got[:2]
    assert payloads(first) == [b"m000", b"m001"] and [d.dup for d in first] == [False, False]
    if defect:   # resent on the same connection (no reconnect in between), DUP = 1, same packet ids
        again = got[2:]
        assert {d.payload for d in again} == {b"m000", b"m001"} and all(d.dup for d in again)
        assert {d.packet_id for d in again} == {d.packet_id for d in first}
    else:
        assert len(got) == 2                   # MQTT 5: resends only on a reconnect


@pytest.mark.parametrize("defect", [False, True], ids=["correct", "retry_gives_up"])
def test_defect_retry_gives_up(brokers, defect):
    """Every save of one client fails for longer than retries x backoff.  With "retry_forever" the correct
    broker keeps retrying and saves the batch once the fault is gone; with the defect it gives up, logs
    "committing anyway" and the batch is lost."""
    cluster = brokers(defects=["retry_gives_up"] if defect else [], persisted_failure_strategy="retry_forever",
                      persisted_failure_retries=2, persisted_failure_backoff_s=0.2)
    sub, pub = offline_backlog(cluster, 5, 0)
    blocker = cluster.key(sub.client_id, "messages")
    cluster.redis.set(blocker, "not-a-zset")   # every save of this client fails with WRONGTYPE
    for i in range(3):
        pub.publish(TOPIC, b"r%d" % i, 1)
    deadline = time.monotonic() + 15
    # past the retry budget: the defect has given up on all three records, the correct broker is still
    # retrying.  The three may come in separate fetches (each publish waits for its PUBACK and the producer
    # lingers 50 ms), so the defect gives up batch by batch: removing the blocker after the first gave up let
    # a later batch's retry succeed (r1, r2 delivered) -- wait until the given-up records add up to three.
    def given_up() -> int:
        return sum(int(n) for n in re.findall(r"giving up on (\d+) records", cluster.log()))

    while time.monotonic() < deadline and not (given_up() >= 3 or "processing failed (attempt 4)" in cluster.log()):
        time.sleep(0.2)
    cluster.redis.delete(blocker)
    assert reconnect(sub) is True
    got = payloads(sub.settle(1.0, timeout=15) if defect else sub.wait_for(3, timeout=15))
    if defect:
        assert got == [] and "committing anyway" in cluster.log()
    else:
        assert got == [b"r0", b"r1", b"r2"] and "committing anyway" not in cluster.log()


@pytest.mark.parametrize("defect", [False, True], ids=["correct", "commit_before_save"])
def test_crash_point_right_after_a_persisted_commit(brokers, defect):
    """SIGUSR1 arms the node's crash point (the nemesis' process_kill at_stage = "persisted_commit"): it dies
    right after its next persisted-topic commit.  The correct broker saved the batch before that commit; with
    commit_before_save the batch was committed and never saved -- lost on every such kill, not on a few
    percent of random ones (broker-kill-at-commit.toml, the detection matrix's scenario)."""
    import os
    import signal

    cluster = brokers(defects=["commit_before_save"] if defect else [], persisted_failure_strategy="retry_forever")
    sub, pub = offline_backlog(cluster, 5, 0)
    node = cluster.nodes[0]
    os.kill(node.pid, signal.SIGUSR1)
    pub.publish(TOPIC, b"c0", 1)                # acknowledged: Kafka has it
    deadline = time.monotonic() + 15
    while node.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not node.is_alive() and "crash point persisted_commit reached" in cluster.log()
    pub.drop()
    node.kill()                                 # reap it
    cluster.start(1)                            # a fresh node takes the partitions once the lease ran out
    moved = cluster.probe(sub.client_id, node=1, version=5)
    assert moved.connect(clean=False, session_expiry=3600) is True
    got = payloads(moved.settle(1.5, timeout=15) if defect else moved.wait_for(1, timeout=15))
    assert got == ([] if defect else [b"c0"])


@pytest.mark.parametrize("defect", [False, True], ids=["correct", "ack_before_durable"])
def test_defect_ack_before_durable(brokers, defect):
    """The store turns Redis' AOF fsync off behind the topology's setting: after a save every node says
    appendfsync no (the correct broker leaves the topology's everysec).  Only a power loss of every node turns
    that into a loss (scenarios/power-loss-always.toml); the shared topology gets its setting back."""
    cluster = brokers(defects=["ack_before_durable"] if defect else [])
    redis = cluster.redis
    before = redis.config_get("appendfsync", target_nodes=redis.ALL_NODES)
    try:
        sub, pub = offline_backlog(cluster, 5, 0)
        pub.publish(TOPIC, b"d0", 1)
        cluster.wait_stored(sub.client_id, 1)
        seen = redis.config_get("appendfsync", target_nodes=redis.ALL_NODES)
        values = {reply["appendfsync"] for reply in seen.values()}
        assert values == ({"no"} if defect else {"everysec"}), seen
    finally:
        for reply in before.values():
            redis.config_set("appendfsync", reply["appendfsync"], target_nodes=redis.ALL_NODES)


# --- the APPLICATION path: the correct behaviour each breaks is asserted in test_broker_application.py
def _app_unacked_then_reconnect(cluster, version: int):
    """An APPLICATION subscriber gets 20 messages, acknowledges the first 10, drops abruptly and resumes;
    returns the first deliveries and those of the resumed session."""
    sub = app.connect_app(cluster, app.app_id(), version, clean=True, auto_ack=False)
    sub.subscribe(FILTER, 1)
    app.publish_many(cluster, 20)
    first = sub.wait_for(20)
    for delivery in first[:10]:
        sub.ack(delivery)
    time.sleep(1.0)
    sub.drop()
    sub.clear()
    sub.auto_ack = True
    assert reconnect(sub) is True
    return first, sub.settle(1.5)


@pytest.mark.parametrize("version", [4, 5])
def test_defect_app_resend_without_dup(brokers, version):
    cluster = brokers(application_clients=app.APP_RULES, defects=["app_resend_without_dup"])
    first, again = _app_unacked_then_reconnect(cluster, version)
    assert payloads(again) == payloads(first[10:])
    assert [d.packet_id for d in again] == [d.packet_id for d in first[10:]]   # the same packet ids ...
    assert not any(d.dup for d in again)                                      # ... and DUP = 0


def _app_topic_reads(cluster, client_id: str):
    """(end offset, records from the start) of the client's own topic: two fresh consumers, no group."""
    import asyncio

    from aiokafka import AIOKafkaConsumer, TopicPartition

    tp = TopicPartition(app.app_topic(client_id), 0)

    async def consumer() -> AIOKafkaConsumer:
        started = AIOKafkaConsumer(bootstrap_servers=cluster.topology.kafka_bootstrap(), enable_auto_commit=False)
        await started.start()
        return started

    async def end() -> int:
        reader = await consumer()
        try:
            return (await reader.end_offsets([tp]))[tp]
        finally:
            await reader.stop()

    async def held() -> list[tuple[int, bytes]]:
        reader = await consumer()
        try:
            reader.assign([tp])
            await reader.seek_to_beginning(tp)
            records = []
            while batches := await reader.getmany(tp, timeout_ms=1000):
                records += [(r.offset, base64.b64decode(orjson.loads(r.value)["payload"])) for r in batches[tp]]
            return records
        finally:
            await reader.stop()

    return lambda: asyncio.run(end()), lambda: asyncio.run(held())


def _wait_app_topic(cluster, client_id: str, records: int = 0, end_offset: int = 0, timeout: float = 20.0) -> None:
    """Until the client's own topic holds ``records`` records and reports an end offset of ``end_offset`` or more.
    On timeout the failure says both, and what the broker logged: a stalled fan-out and a short end offset read
    differently."""
    end, held = _app_topic_reads(cluster, client_id)
    deadline = time.monotonic() + timeout
    seen: list[int] = []
    while (not seen or seen[-1] < end_offset) or (records and len(held()) < records):
        if time.monotonic() >= deadline:
            got = held()
            log = cluster.log().splitlines()
            raise AssertionError(f"wanted {records} records and an end offset of {end_offset} or more; the end offsets "
                                 f"read: {seen}; the topic holds {len(got)} records {got}; the broker log ends:\n"
                                 + "\n".join(log[-40:]))
        if seen:
            time.sleep(0.3)
        seen.append(end())


@pytest.mark.parametrize("version", [4, 5])
def test_defect_app_backlog_from_end(brokers, version):
    cluster = brokers(application_clients=app.APP_RULES, defects=["app_backlog_from_end"])
    client_id = app.app_id()
    sub = app.connect_app(cluster, client_id, version, clean=True)
    sub.subscribe(FILTER, 1)
    sub.disconnect()
    # The offline backlog, and the end offset the defect seeks to past it.  Tansu's end offset on S3 is the first
    # offset of the stored batch with the newest Last-Modified, plus one; Last-Modified has whole seconds, and a tie
    # keeps the lowest offset (docs/recipes.md).  So the backlog's second half is written a second after the first
    # is all stored: the end offset then lands inside it, never at the first half's start.
    app.publish_many(cluster, 30, prefix=b"a")
    _wait_app_topic(cluster, client_id, records=30)
    time.sleep(1.1)
    app.publish_many(cluster, 30, prefix=b"b")
    _wait_app_topic(cluster, client_id, end_offset=31)
    sub.clear()
    assert reconnect(sub) is True                    # session present 1 ...
    app.publish_many(cluster, 3, prefix=b"n")
    got = payloads(sub.settle(1.5))
    assert b"n00002" in got and not any(p.startswith(b"a") for p in got)   # ... but the backlog skipped


def test_defect_shared_drop_on_leave(brokers):
    """A member dropped with messages unacknowledged: they reach no other member of the group (control:
    test_broker_shared.py test_a_killed_member_s_unacknowledged_messages_go_to_another_member)."""
    import test_broker_shared as shared

    cluster = brokers(application_clients=shared.APP_RULES, defects=["shared_drop_on_leave"])
    topic, topic_filter = shared.topic_and_filter()
    share = f"$share/g{shared.app_id()}/{topic_filter}"
    victim = shared.members(cluster, share, 1, auto_ack=False)[0]
    survivors = shared.members(cluster, share, 2)
    count = 60
    expected = shared.publish_many(cluster, topic, count)
    shared.wait_union([victim, *survivors], count)
    held = {d.payload for d in victim.deliveries}
    assert held, "the victim got its share (round-robin)"
    victim.drop()
    time.sleep(3.0)  # the correct broker hands them over within a second
    got = {d.payload for s in survivors for d in s.settle(0.5)}
    assert got == set(expected) - held, "the held messages went to no other member, the rest arrived"


def test_defect_will_after_normal_disconnect(brokers, will_clients):
    """A normal DISCONNECT, and yet the Will is published (control: test_mqtt_3_1_2_10_no_will_after_normal_
    disconnect_but_after_0x04)."""
    cluster = brokers(defects=["will_after_normal_disconnect"])
    topic = will_topic()
    sub = subscriber(cluster, topic, 4)
    polite = will_clients(cluster, 4, topic, b"polite")
    polite.connect()
    polite.disconnect()
    assert [d.payload for d in sub.wait_for(1, timeout=10)] == [b"polite"]


def test_defect_will_delay_ignored(brokers, will_clients):
    """Will Delay 5 s: the Will arrives right after the drop, and a resume within the delay does not cancel it
    (control: test_mqtt_3_1_3_9_will_delay_respected_and_cancelled_by_reconnect)."""
    cluster = brokers(defects=["will_delay_ignored"])
    topic = will_topic()
    sub = subscriber(cluster, topic, 5)
    dropped, same_client = dropped_with_delayed_will(will_clients, cluster, topic, b"early", 5)
    again = same_client()
    assert again.connect(clean=False, session_expiry=60) is True  # resumed within the delay
    [got] = sub.wait_for(1, timeout=10)
    assert got.payload == b"early" and got.at - dropped < 2.0, f"Will after {got.at - dropped:.1f} s, delay 5 s"
    again.disconnect()


def test_defect_retained_in_node_memory(brokers):
    """Retained through node 1: a subscriber on node 1 gets it, one on node 2 does not, and after node 1's
    restart neither does one there (control: test_retained_message_survives_a_broker_node_kill)."""
    cluster = brokers(count=2, defects=["retained_in_node_memory"])
    topic = f"retained/{uuid.uuid4().hex[:8]}"
    pub = cluster.probe(version=4, node=0)
    pub.connect(clean=True)
    pub.publish(topic, b"in-memory", 1, retain=True)
    pub.drop()
    assert [(d.payload, d.retain) for d in retained(subscriber(cluster, topic, 5, node=0))] == [(b"in-memory", True)]
    assert retained(subscriber(cluster, topic, 5, node=1), timeout=1.5) == []
    cluster.nodes[0].kill()
    cluster.nodes[0].start()
    cluster.nodes[0].wait_ready(30)
    assert retained(subscriber(cluster, topic, 5, node=0), timeout=1.5) == []
