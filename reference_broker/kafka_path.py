"""The broker's Kafka path for persistent (DEVICE) sessions: topic creation, partition leases, the leased
consumers, the fan-out and the persister (TBMQ's flow: docs/tbmq-notes.md "The flow and its commit
points"; this broker's: docs/reference-broker.md "Data flow and commit points").

incoming topic (key = MQTT topic)  --fan-out-->  persisted topic (key = subscriber client id)
                                   --fan-out-->  tbmq.msg.app.<client> (a persistent APPLICATION client's own
                                                 topic, read by its connection: application.py)
persisted topic  --one save script per client per poll, commit, then live hints-->  Redis + connections

What these stages ask of the node that runs them is declared in ``NodeForKafkaPath``; the node
(server.py) composes them, they do not import it.

Partition ownership: Tansu's consumer-group joins take seconds, so the nodes do not use group
membership.  Each node heartbeats into Redis; with N live nodes sorted by id, node i wants the
partitions p with p % N == i and holds a Redis lease per partition (renewed every lease/3).  A consumer
``assign()``s exactly the partitions it holds and commits offsets to Kafka under a fixed group id, so a
partition that moves to another node (node death: after the lease runs out) resumes from its committed
offset.  Overlap while a lease moves costs duplicates, never loss (commits happen only after the work).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError

from reference_broker.app_clients import app_topic
from reference_broker.codec import topic_matches
from reference_broker.config import BrokerConfig
from reference_broker.peers import Peers
from reference_broker.shared_subs import parse_shared, shared_topic
from reference_broker.store import SessionStore
from reference_broker.topic_index import TopicIndex

# the logger's name is part of the broker's log format (tests and stored runs' logs carry it), not a module path
log = logging.getLogger("reference_broker.pipeline")

DEAD_AFTER_LEASES = 3  # a node silent this many leases is dead: its connected sessions are released


ENSURE_TOPICS_ATTEMPTS = 5
SLOW_STEP_S = 1.0  # a consumer batch (poll + process + commit) slower than this is logged


class NodeForKafkaPath(Protocol):
    """What the Kafka stages ask of the broker node that runs them (server.py's Broker)."""

    config: BrokerConfig
    store: SessionStore
    stats: Counter[str]
    node_id: str
    peer_address: str
    peers: Peers
    kafka_bootstrap: str
    producer: AIOKafkaProducer
    leases: LeaseManager

    def crash_point(self, stage: str) -> None: ...

    async def ensure_app_topic(self, topic: str) -> None: ...

    async def hint(self, client: str) -> None: ...

    async def route_live(self, client: str, node: str | None, message: dict[str, Any]) -> None: ...

    async def reassert_sessions(self) -> None: ...

    async def release_dead_node_sessions(self, node: str) -> None: ...


async def ensure_topics(bootstrap: str, topics: dict[str, int]) -> None:
    for attempt in range(1, ENSURE_TOPICS_ATTEMPTS + 1):
        # Nodes started together create the topics together; Tansu on S3 can then read a half-written
        # metadata object and close the connection (KafkaConnectionError): retry instead of dying.
        try:
            await _ensure_topics_once(bootstrap, topics)
            return
        except KafkaError as error:
            if attempt == ENSURE_TOPICS_ATTEMPTS:
                raise
            log.warning("creating topics %s failed (%r), attempt %d of %d; retrying", sorted(topics), error,
                        attempt, ENSURE_TOPICS_ATTEMPTS)
            await asyncio.sleep(0.3 * attempt)


async def _ensure_topics_once(bootstrap: str, topics: dict[str, int]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15000)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [NewTopic(name, n, 1) for name, n in topics.items() if name not in existing]
        if missing:
            with contextlib.suppress(Exception):  # another node may create them at the same time
                await admin.create_topics(missing)
    finally:
        await admin.close()


def live_nodes(nodes: dict[str, dict[str, Any]], now_ms: float, lease_s: float) -> list[str]:
    """Node ids whose heartbeat is younger than the lease, sorted (every node computes the same list)."""
    return sorted(n for n, info in nodes.items() if now_ms - info["ts"] < lease_s * 1000)


def desired_partitions(node_id: str, live: list[str], count: int) -> set[int]:
    """Node i of N live nodes wants the partitions p with p % N == i (all of them when alone or unknown)."""
    if node_id not in live:
        return set(range(count)) if not live else set()
    index = live.index(node_id)
    return {p for p in range(count) if p % len(live) == index}


class LeaseManager:
    """Which partitions of which topic this node consumes (see the module doc)."""

    def __init__(self, broker: NodeForKafkaPath, topics: dict[str, int]) -> None:
        self.broker = broker
        self.topics = topics
        self.held: dict[str, set[int]] = {t: set() for t in topics}
        self.desired: dict[str, set[int]] = {t: set() for t in topics}
        self.assigned: dict[str, set[int]] = {t: set() for t in topics}
        self.changed = asyncio.Event()
        self.ticks = 0

    def target(self, topic: str) -> set[int]:
        return self.held[topic] & self.desired[topic]

    async def tick(self) -> None:
        config = self.broker.config
        nodes, was_missing = await self.broker.store.heartbeat(self.broker.node_id, self.broker.peer_address)
        now_ms = time.time() * 1000
        live = live_nodes(nodes, now_ms, config.partition_lease_s)
        self.broker.peers.addresses = {n: info["peer"] for n, info in nodes.items()}
        if was_missing and self.ticks:
            await self.broker.reassert_sessions()  # declared dead while paused: take our sessions back
        self.ticks += 1
        for node, info in nodes.items():
            if node != self.broker.node_id and now_ms - info["ts"] > DEAD_AFTER_LEASES * config.partition_lease_s * 1000:
                if await self.broker.store.claim_dead_node(node):
                    await self.broker.release_dead_node_sessions(node)
        for topic, count in self.topics.items():
            desired = desired_partitions(self.broker.node_id, live, count)
            # keep what the consumer still reads until it lets go at its next batch boundary
            want = sorted(desired | self.assigned[topic])
            release = sorted(self.held[topic] - set(want))
            held = await self.broker.store.renew_leases(self.broker.node_id, topic, want, release,
                                                        int(config.partition_lease_s * 1000))
            if held != self.held[topic] or desired != self.desired[topic]:
                self.changed.set()
            self.held[topic], self.desired[topic] = held, desired

    async def run(self) -> None:
        period = self.broker.config.partition_lease_s / 3
        while True:
            try:
                await self.tick()
            except Exception as error:
                log.warning("lease tick failed: %r", error)
            await asyncio.sleep(period)


class LeasedConsumer:
    """Polls the partitions this node holds, hands each poll to ``process``, then commits."""

    def __init__(self, broker: NodeForKafkaPath, topic: str, stage: str,
                 process: Callable[[list[Any]], Awaitable[None]],
                 after_commit: Callable[[], Awaitable[None]] | None = None) -> None:
        self.broker = broker
        self.after_commit = after_commit
        self.topic = topic
        self.stage = stage  # "incoming" | "persisted": selects the failure strategy
        self.process = process
        self.consumer: AIOKafkaConsumer | None = None
        self.records_done = 0

    async def run(self) -> None:
        config = self.broker.config
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=self.broker.kafka_bootstrap, group_id=f"ordeal-broker-{self.topic}",
            enable_auto_commit=False, auto_offset_reset="earliest", request_timeout_ms=30000,
            # see BrokerConfig.kafka_fetch_max_wait_ms: too short starves on S3, too long adds latency
            fetch_max_wait_ms=config.kafka_fetch_max_wait_ms,
            max_poll_records=config.poll_max_records)
        await self.consumer.start()
        leases = self.broker.leases
        assigned: set[int] = set()
        try:
            while True:
                target = leases.target(self.topic)
                if target != assigned:
                    log.info("%s: consuming partitions %s", self.topic, sorted(target))
                    self.consumer.assign([TopicPartition(self.topic, p) for p in sorted(target)])
                    assigned = target
                    leases.assigned[self.topic] = set(assigned)
                if not assigned:
                    leases.changed.clear()
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(leases.changed.wait(), 1.0)
                    continue
                polled_at = time.monotonic()
                try:
                    batch = await self.consumer.getmany(timeout_ms=100, max_records=config.poll_max_records)
                except Exception as error:
                    log.warning("%s poll failed: %r", self.topic, error)
                    await asyncio.sleep(0.5)
                    continue
                if not batch:
                    continue
                records = [r for tp in sorted(batch, key=lambda t: t.partition) for r in batch[tp]]
                offsets = {tp: recs[-1].offset + 1 for tp, recs in batch.items()}
                started = time.monotonic()
                if self.stage == "persisted" and config.has("commit_before_save"):
                    await self._commit(offsets)  # defect: the batch is lost if the node dies now
                    self._crash_point()
                    await self._process_with_strategy(records)
                else:
                    await self._process_with_strategy(records)
                    processed = time.monotonic()
                    await self._commit(offsets)
                    self._crash_point()
                    self._log_if_slow(records, polled_at, started, processed)
                if self.after_commit is not None:
                    try:
                        await self.after_commit()
                    except Exception as error:  # hints only: the periodic re-check covers a lost one
                        log.warning("%s: live hints failed: %r", self.topic, error)
                self.records_done += len(records)
        finally:
            with contextlib.suppress(Exception):
                await self.consumer.stop()

    def _crash_point(self) -> None:
        if self.stage == "persisted":
            self.broker.crash_point("persisted_commit")  # armed by the nemesis (server.py crash_armed)

    def _log_if_slow(self, records: list[Any], polled_at: float, started: float, processed: float) -> None:
        # a stall anywhere in a hop shows up in the run's broker log: a slow step of ours, or records that
        # reached this consumer late (Kafka: produce -> fetch)
        now = time.monotonic()
        stamps = [r.timestamp for r in records if r.timestamp and r.timestamp > 0]
        age = time.time() - min(stamps) / 1000 if stamps else 0.0
        if now - polled_at < SLOW_STEP_S and age < 2 * SLOW_STEP_S:
            return
        log.warning("%s: slow batch of %d records: poll %.1f s, process %.1f s, commit %.1f s, oldest record "
                    "%.1f s old", self.topic, len(records), started - polled_at, processed - started,
                    now - processed, age)

    async def _commit(self, offsets: dict[TopicPartition, int]) -> None:
        # Fencing: commit only partitions whose lease this node still holds.  A node that was paused past
        # its lease wakes up with a batch another node has processed since; committing its older offsets
        # would move the group back and make the next owner process everything again.
        try:
            owners = await self.broker.store.lease_owners(self.topic, [tp.partition for tp in offsets])
        except Exception as error:
            log.warning("%s: lease check before commit failed: %r", self.topic, error)
            owners = {}
        lost = {tp.partition for tp in offsets if owners.get(tp.partition) != self.broker.node_id}
        if lost:
            log.info("%s: lease of partitions %s lost meanwhile; not committing them", self.topic, sorted(lost))
            self.broker.leases.held[self.topic] -= lost
            self.broker.leases.changed.set()
            offsets = {tp: offset for tp, offset in offsets.items() if tp.partition not in lost}
            if not offsets:
                return
        # a failed commit only means the batch may be processed again (duplicates), so keep going
        for attempt in range(5):
            try:
                await self.consumer.commit(offsets)
                return
            except Exception as error:
                log.warning("%s commit failed (attempt %d): %r", self.topic, attempt + 1, error)
                await asyncio.sleep(0.5)

    async def _process_with_strategy(self, records: list[Any]) -> None:
        config = self.broker.config
        strategy = getattr(config, f"{self.stage}_failure_strategy")
        retries = getattr(config, f"{self.stage}_failure_retries")
        backoff = getattr(config, f"{self.stage}_failure_backoff_s")
        attempt = 0
        while True:
            try:
                await asyncio.wait_for(self.process(records), config.processing_timeout_s)
                return
            except asyncio.CancelledError:
                raise
            except Exception as error:
                attempt += 1
                if attempt > retries and (strategy == "skip" or self.broker.config.has("retry_gives_up")):
                    # (defect retry_gives_up: "retry_forever" configured, yet it gives up like "skip")
                    # TBMQ's default: give up and commit anyway -- these records are lost
                    log.error("%s: giving up on %d records after %d attempts (%r); committing anyway",
                              self.topic, len(records), attempt, error)
                    self.broker.stats["skipped_records"] += len(records)
                    return
                log.warning("%s: processing failed (attempt %d): %r; retrying", self.topic, attempt, error)
                await asyncio.sleep(backoff)


class FanOut:
    """Incoming topic -> persisted topic (persistent QoS>0 subscribers) or live delivery (others)."""

    def __init__(self, broker: NodeForKafkaPath) -> None:
        self.broker = broker
        self.version = -1
        self.index = TopicIndex({})
        self.shared_index = TopicIndex({})  # keyed by the shared subscriptions' filters themselves, not by client
        self.loaded_at = 0.0

    def _load(self, subscriptions: dict[str, dict[str, Any]]) -> None:
        self.index = TopicIndex(subscriptions)
        filters = {parse_shared(text).topic_filter for record in subscriptions.values()
                   for text in record.get("shared", {})}
        self.shared_index = TopicIndex({f: {"filters": {f: 1}} for f in filters})

    async def refresh(self) -> None:
        store = self.broker.store
        if self.broker.config.has("stale_subscription_cache"):
            # defect: refresh on a timer instead of on every change
            if time.monotonic() - self.loaded_at < 5.0 and self.version >= 0:
                return
            self._load(await store.all_subscriptions())
            self.version = 0
            self.loaded_at = time.monotonic()
            return
        version = await store.subscriptions_version()
        if version != self.version:
            self._load(await store.all_subscriptions())
            self.version = version

    async def process(self, records: list[Any]) -> None:
        await self.refresh()
        broker = self.broker
        pending = []
        for record in records:
            message = orjson.loads(record.value)
            for topic_filter in self.shared_index.match(message["topic"]):
                # one copy per filter, whatever the number of groups on it (TBMQ: unique shared topics); each
                # group reads it from its own offset and delivers it to one member (shared_delivery.py)
                topic = shared_topic(topic_filter)
                await broker.ensure_app_topic(topic)
                pending.append(await broker.producer.send(topic, record.value, key=message["topic"].encode(),
                                                          partition=0))
            for client, granted in self.index.match(message["topic"]).items():
                sub = self.index.records[client]
                own = client == message.get("publisher")
                if sub.get("no_local") and own:
                    granted = not_local_grant(sub, message["topic"])
                    if granted is None:
                        continue  # [MQTT-3.8.3-3]: only No Local filters match the publisher's own message
                # [MQTT-3.8.4-8] (3.1.1 §3.8.4): the minimum of the published QoS and the granted one
                qos = min(granted, message["qos"])
                if broker.config.has("qos_upgrade"):
                    qos = granted  # defect: delivered at the subscription's QoS, also above the published one
                # "gen": the session this subscription belongs to; a newer session of the client drops it
                out = dict(message, qos=qos, gen=sub["gen"]) if sub.get("gen") else dict(message, qos=qos)
                if sub.get("sub_ids") or sub.get("rap"):
                    sub_ids, rap = subscription_options(sub, message["topic"], own)
                    if sub_ids:
                        out["subIds"] = sub_ids
                    if rap and message.get("retain"):
                        out["rapRetain"] = True
                if sub.get("persistent") and qos > 0 and sub.get("app"):
                    # a persistent APPLICATION client: its own topic, read by the node holding its connection
                    pending.append(await broker.producer.send(
                        app_topic(client), orjson.dumps(out), key=client.encode(), partition=0))
                elif sub.get("persistent") and qos > 0:
                    pending.append(await broker.producer.send(
                        broker.config.persisted_topic, orjson.dumps(out), key=client.encode()))
                else:
                    await broker.route_live(client, sub.get("node"), out)
        # commit (by the caller) only after every persisted-topic write is acknowledged
        if pending:
            await asyncio.gather(*pending)


def subscription_options(record: dict[str, Any], topic: str, own: bool) -> tuple[list[int], bool]:
    """(Subscription Identifiers, Retain As Published) of the client's filters matching ``topic`` (of those without
    No Local when ``own``).  One copy goes to the client, so it carries every matching subscription's identifier
    ([MQTT-3.3.4-3], -4), in ascending order; its RETAIN is the published flag when any of them has Retain As
    Published ([MQTT-3.3.1-13]; MQTT 5 leaves a mix of options on overlapping subscriptions open)."""
    no_local = set(record.get("no_local", ())) if own else set()
    matching = [f for f in record.get("filters", {}) if f not in no_local and topic_matches(f, topic)]
    ids = record.get("sub_ids", {})
    rap = set(record.get("rap", ()))
    return sorted({int(ids[f]) for f in matching if f in ids}), any(f in rap for f in matching)


def not_local_grant(record: dict[str, Any], topic: str) -> int | None:
    """The highest QoS among the subscription's matching filters that do not have No Local, or None."""
    no_local = set(record.get("no_local", ()))
    grants = [int(qos) for topic_filter, qos in record.get("filters", {}).items()
              if topic_filter not in no_local and topic_matches(topic_filter, topic)]
    return max(grants) if grants else None


class Persister:
    """Persisted topic -> one save script per client per poll -> (commit) -> hints to the connections."""

    def __init__(self, broker: NodeForKafkaPath) -> None:
        self.broker = broker
        self.pending_hints: list[str] = []

    async def process(self, records: list[Any]) -> None:
        broker = self.broker
        by_client: dict[str, list[dict[str, Any]]] = defaultdict(list)
        now_ms = time.time() * 1000
        for record in records:
            message = orjson.loads(record.value)
            expires_at = message.get("expiresAt")
            message["expiry"] = None if expires_at is None else max(0, math.ceil((expires_at - now_ms) / 1000))
            by_client[record.key.decode()].append(message)
        semaphore = asyncio.Semaphore(broker.config.redis_batch_size)

        async def save(client: str, messages: list[dict[str, Any]]) -> None:
            async with semaphore:
                await broker.store.save(client, messages)

        results = await asyncio.gather(*(save(c, m) for c, m in by_client.items()), return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            # the whole poll is retried: clients already saved get their messages twice (duplicates,
            # allowed for QoS 1), none is lost
            raise failures[0]
        broker.stats["saved"] += len(records)
        self.pending_hints = list(by_client)

    async def after_commit(self) -> None:
        clients, self.pending_hints = self.pending_hints, []
        for client in clients:
            await self.broker.hint(client)
