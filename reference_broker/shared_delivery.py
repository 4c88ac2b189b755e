"""Shared subscriptions of persistent APPLICATION clients: one group, one Kafka topic position, its messages spread
over the group's connected members (docs/reference-broker.md "Shared subscriptions").

A group (share name + filter) is like one APPLICATION client (application.py) whose deliveries go to several
connections: the node that holds the group's Redis lease reads the filter's shared topic (``shared_subs.shared_topic``,
one partition) from the group's committed offset in packs, gives each message to one local member round-robin
(among those with room in their Receive Maximum), waits for the acknowledgements and commits the end of the
acknowledged prefix (``acked_prefix_end``), with the APPLICATION ack strategy on a pack timeout.  A member that goes
away (DISCONNECT, a dropped socket, UNSUBSCRIBE, a takeover) hands its unacknowledged messages back: they go to
another member, DUP = 1 (MQTT 5 §4.8.2).  With no member left on the node the group stops and lets go of its lease;
what it had not committed is read again by the next holder (duplicates, never loss).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition

from reference_broker.app_clients import acked_prefix_end
from reference_broker.application import AckStrategy
from reference_broker.shared_subs import SharedFilter, shared_consumer_group, shared_topic

log = logging.getLogger("reference_broker.shared")


class SharedGroup:
    """This node's side of one shared group: its local members and, while it holds the lease, the group's reader."""

    def __init__(self, broker: Any, shared: SharedFilter) -> None:  # broker: server.py's Broker
        self.broker = broker
        self.config = broker.config
        self.shared = shared
        self.key = shared.text
        self.topic = shared_topic(shared.topic_filter)
        self.group_id = shared_consumer_group(shared)
        self.tp = TopicPartition(self.topic, 0)
        self.lease_key = broker.store.shared_key(f"shared_lease:{self.group_id}")
        self.since_key = broker.store.shared_key(f"shared_since:{self.group_id}")
        self.since = 0                           # ms: records published before the group began are not its own
        self.members: dict[str, Any] = {}        # conn_id -> Connection
        self.grants: dict[str, int] = {}         # conn_id -> granted QoS
        self.turn = 0
        self.pending: deque[tuple[int, dict[str, Any]]] = deque()  # (offset, message) to give to a member
        self.flight: dict[int, tuple[Any, int]] = {}               # offset -> (member connection, packet id)
        self.done: set[int] = set()
        self.messages: dict[int, dict[str, Any]] = {}  # offset -> message, of the pack being delivered
        self.sent_upto = -1                      # highest offset handed to a member by this node (DUP on a resend)
        self.progress = asyncio.Event()
        self.task: asyncio.Task | None = None
        self.committed: int | None = None

    # ------------------------------------------------------------ membership (from the connections)
    def join(self, conn: Any, qos: int) -> None:
        self.members[conn.conn_id] = conn
        self.grants[conn.conn_id] = qos
        self.progress.set()
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self.run())

    def leave(self, conn: Any) -> None:
        """``conn`` is no member any more: what it had in flight goes to another member."""
        if self.members.pop(conn.conn_id, None) is None:
            return
        self.grants.pop(conn.conn_id, None)
        back = sorted(o for o, (member, _pid) in self.flight.items() if member is conn and o not in self.done)
        for offset in back:
            _member, pid = self.flight.pop(offset)
            conn.inflight.pop(pid, None)
        if back and self.config.has("shared_drop_on_leave"):  # defect: counted as delivered, never handed on
            self.done.update(back)
        elif back:
            log.info("%s: member %s left with %d unacknowledged messages (offsets %d..%d): they go to another "
                     "member", self.key, conn.client_id, len(back), back[0], back[-1])
            # in offset order, ahead of what is not yet sent
            self.pending.extendleft(reversed([(o, self.messages[o]) for o in back]))
        self.progress.set()

    def on_ack(self, conn: Any, pid: int, offset: int) -> None:
        if self.flight.get(offset, (None, None))[0] is not conn:
            return  # handed to another member meanwhile: that one's acknowledgement counts
        del self.flight[offset]
        self.done.add(offset)
        conn._flow_ended(pid)
        self.progress.set()

    # ------------------------------------------------------------ the reader
    async def run(self) -> None:
        try:
            while self.members:
                if not await self.acquire():
                    with contextlib.suppress(asyncio.TimeoutError):
                        self.progress.clear()
                        await asyncio.wait_for(self.progress.wait(), self.config.partition_lease_s / 3)
                    continue
                renew = asyncio.get_running_loop().create_task(self.renew())
                try:
                    await self.read()
                finally:
                    renew.cancel()
                    await self.release()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s: shared group reader failed; starting it again", self.key)
            await asyncio.sleep(1.0)
        finally:
            self.task = None
            if self.members:  # a member joined while this reader was ending
                self.task = asyncio.get_running_loop().create_task(self.run())

    async def acquire(self) -> bool:
        redis, node = self.broker.store.redis, self.broker.node_id
        ms = int(self.config.partition_lease_s * 1000)
        try:
            if await redis.set(self.lease_key, node, nx=True, px=ms):
                return True
            owner = await redis.get(self.lease_key)
            return (owner.decode() if isinstance(owner, bytes) else owner) == node
        except Exception as error:
            log.warning("%s: lease check failed: %r", self.key, error)
            return False

    async def renew(self) -> None:
        redis, node = self.broker.store.redis, self.broker.node_id
        while True:
            await asyncio.sleep(self.config.partition_lease_s / 3)
            with contextlib.suppress(Exception):
                owner = await redis.get(self.lease_key)
                if (owner.decode() if isinstance(owner, bytes) else owner) == node:
                    await redis.pexpire(self.lease_key, int(self.config.partition_lease_s * 1000))

    async def release(self) -> None:
        with contextlib.suppress(Exception):
            owner = await self.broker.store.redis.get(self.lease_key)
            if (owner.decode() if isinstance(owner, bytes) else owner) == self.broker.node_id:
                await self.broker.store.redis.delete(self.lease_key)

    async def holds_lease(self) -> bool:
        owner = await self.broker.store.redis.get(self.lease_key)
        return (owner.decode() if isinstance(owner, bytes) else owner) == self.broker.node_id

    async def read(self) -> None:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.broker.kafka_bootstrap, group_id=self.group_id, enable_auto_commit=False,
            auto_offset_reset="earliest", request_timeout_ms=30000,
            fetch_max_wait_ms=self.config.kafka_fetch_max_wait_ms,
            max_poll_records=self.config.application_poll_max_records)
        await consumer.start()
        try:
            consumer.assign([self.tp])
            committed = await consumer.committed(self.tp)
            if committed is None:
                await consumer.seek_to_beginning(self.tp)
            else:
                consumer.seek(self.tp, committed)
            self.committed = committed
            since = await self.broker.store.redis.get(self.since_key)
            self.since = int(since) if since else 0
            log.info("%s: reading %s from offset %s for %d local member(s)", self.key, self.topic, committed,
                     len(self.members))
            while self.members:
                try:
                    batch = await consumer.getmany(self.tp, timeout_ms=200,
                                                   max_records=self.config.application_poll_max_records)
                except Exception as error:
                    log.warning("%s: poll failed: %r", self.key, error)
                    await asyncio.sleep(0.5)
                    continue
                records = batch.get(self.tp, [])
                if records and not await self.process_pack(consumer, records):
                    return  # every member left mid-pack: the next holder reads from the committed offset
        finally:
            with contextlib.suppress(Exception):
                await consumer.stop()

    async def process_pack(self, consumer: AIOKafkaConsumer, records: list[Any]) -> bool:
        offsets = [r.offset for r in records]
        self.done, self.flight, self.pending = set(), {}, deque()
        self.messages = {}
        now_ms = time.time() * 1000
        for record in records:
            message = orjson.loads(record.value)
            if message.get("time", self.since) < self.since:
                # written for another group on this filter before this group began (a new group starts at the
                # topic's end, and Tansu's end offset can be short of the truth)
                self.done.add(record.offset)
                continue
            expires_at = message.get("expiresAt")
            if expires_at is not None and expires_at <= now_ms and not self.config.has("ignore_message_expiry"):
                self.done.add(record.offset)  # expired: never sent
                continue
            self.messages[record.offset] = message
            self.pending.append((record.offset, message))
        strategy = AckStrategy(self.config.application_ack_strategy, self.config.application_retries)
        timeout = self.config.application_pack_timeout_s
        deadline = time.monotonic() + timeout
        while True:
            self.hand_out()
            await self.commit_prefix(consumer, offsets)
            if all(o in self.done for o in offsets):
                await self.commit_prefix(consumer, offsets)  # acks that came during the commit above
                return True
            if not self.members:
                return False
            self.progress.clear()
            left = deadline - time.monotonic()
            if left > 0:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.progress.wait(), min(left, 1.0))
                continue
            decision = strategy.on_timeout()
            missing = [o for o in offsets if o not in self.done]
            if not decision.commit_all:
                log.warning("%s: %d of %d messages of the pack unacknowledged after %.1f s; retry %d of %s",
                            self.key, len(missing), len(offsets), timeout, decision.retry,
                            self.config.application_retries or "unlimited")
                deadline = time.monotonic() + timeout
                continue
            log.error("%s: giving up on %d unacknowledged messages of shared topic %s (offsets %d..%d); "
                      "committing over them", self.key, len(missing), self.topic, missing[0], missing[-1])
            self.broker.stats["shared_skipped"] += len(missing)
            for offset in missing:
                member, pid = self.flight.pop(offset, (None, None))
                if member is not None:
                    member.inflight.pop(pid, None)
            self.pending.clear()
            self.done.update(missing)
            await self.commit_prefix(consumer, offsets)
            return True

    def hand_out(self) -> None:
        """Each pending message to the next member (round-robin) with room in its window."""
        touched = set()
        while self.pending:
            members = [m for m in self.members.values() if not m.closed and len(m.inflight) < m.window]
            if not members:
                break
            conn = members[self.turn % len(members)]
            self.turn += 1
            offset, message = self.pending.popleft()
            qos = min(message["qos"], self.grants.get(conn.conn_id, 1))
            dup = offset <= self.sent_upto
            self.sent_upto = max(self.sent_upto, offset)
            pid = conn._free_local_id() if qos else None
            packet = conn._publish(message, qos, pid, dup and qos > 0, conn._remaining_expiry(message))
            touched.add(conn)
            if not conn.send_publish(packet) or not qos:
                self.done.add(offset)  # QoS 0, or too large for the member ([MQTT-3.1.2-25]): as if delivered
                continue
            conn.inflight[pid] = ("shared", f"{offset}|{self.key}")
            self.flight[offset] = (conn, pid)
        for conn in touched:
            conn.flush()

    async def commit_prefix(self, consumer: AIOKafkaConsumer, offsets: list[int]) -> None:
        end = acked_prefix_end(offsets, self.done)
        if end is None or (self.committed is not None and end <= self.committed):
            return
        try:
            if not await self.holds_lease():  # fencing: another node reads the group now
                log.info("%s: lease lost; offset %d not committed", self.key, end)
                return
            await consumer.commit({self.tp: end})
        except Exception as error:
            log.warning("%s: commit of shared topic offset %d failed: %r", self.key, end, error)
            return
        self.committed = end


async def start_group_at_end(bootstrap: str, store: Any, shared: SharedFilter) -> None:
    """A group that nobody holds yet starts at the topic's end: its first member gets what is published from its
    SUBSCRIBE on, not what the filter's topic holds for other groups or for an earlier group of that name.  The
    start time is kept too (``shared_since:<group>``): records published before it are skipped."""
    await store.redis.set(store.shared_key(f"shared_since:{shared_consumer_group(shared)}"), int(time.time() * 1000))
    tp = TopicPartition(shared_topic(shared.topic_filter), 0)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=shared_consumer_group(shared),
                                enable_auto_commit=False, request_timeout_ms=30000)
    await consumer.start()
    try:
        consumer.assign([tp])
        await consumer.seek_to_end(tp)
        await consumer.commit({tp: await consumer.position(tp)})
    finally:
        with contextlib.suppress(Exception):
            await consumer.stop()


def ack_entry(entry: tuple[str, str]) -> tuple[int, str]:
    """(offset, group key) of a connection's in-flight entry of kind "shared"."""
    offset, _, key = entry[1].partition("|")
    return int(offset), key

