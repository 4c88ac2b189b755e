"""APPLICATION clients, TBMQ's way: a Kafka topic per persistent APPLICATION client, read from its committed offset.

TBMQ (thingsboard/tbmq; docs/reference-broker.md "APPLICATION clients") classifies each client as DEVICE or
APPLICATION from its MQTT client credentials.  A persistent DEVICE session's messages go through the persisted
topic into Redis; a persistent APPLICATION session's go to a topic of its own, ``tbmq.msg.app.<client id>``
(one partition), and the node holding the client's connection reads it with a consumer of its own
(group ``application-persisted-msg-consumer-group-<client id>``), in packs: one poll is delivered, the
acknowledgements awaited, and the offset committed.

This broker's version:
- ``classify`` decides the type from the ``application_clients`` rules of the broker config (the reference broker
  has no credentials store; a rule names a client-id glob and / or a user name, as TBMQ's basic credentials do);
- the consumer is assigned partition 0 by hand (no group join: Tansu's joins take seconds) and commits under the
  per-client group id, so the offset lives in Kafka and survives the node's kill;
- the offset committed is the end of the *contiguous acknowledged prefix* of the pack (PUBACK, or PUBCOMP for
  QoS 2), never past a message the client has not acknowledged (TBMQ #320 committed over undelivered offsets);
- the packet id is a function of the offset (``packet_id_for``): a resend on any node carries the same id, and
  the highest offset handed to the wire is recorded in Redis before it goes out (``{client}_app`` field
  ``sent``), so a resend after a reconnect carries DUP = 1 (TBMQ #320 resent with DUP = 0);
- a pack not fully acknowledged within ``application_pack_timeout_s``: ``retry`` waits again, up to
  ``application_retries`` times (0 = forever), the counter kept for the whole pack (TBMQ #320 reset it), then
  gives up like ``skip``: every give-up is an ERROR line naming the offsets it commits over.  MQTT forbids
  resending on the same connection ([MQTT-4.4.0-1]), so a retry does not resend: the unacknowledged messages go
  out again, DUP = 1, when the client reconnects.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition

from reference_broker import codec
from reference_broker.app_clients import (  # noqa: F401  (re-exported: the names of the path in one place)
    ACK_STRATEGIES,
    APPLICATION,
    DEVICE,
    AppClientRule,
    acked_prefix_end,
    app_consumer_group,
    app_topic,
    classify,
    packet_id_for,
    parse_rules,
)
from reference_broker.codec import Ack

log = logging.getLogger("reference_broker.application")
# how long the end of a connection waits to commit what its client acknowledged (ApplicationDelivery.finish)
FINAL_COMMIT_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class AckDecision:
    commit_all: bool   # give up on the pack: commit over what is unacknowledged
    retry: int         # the retry this is (1-based), when not giving up


class AckStrategy:
    """TBMQ's ApplicationMsgAcknowledgeStrategyFactory, one object per pack (its counter lives as long as the
    pack: TBMQ #320 made a new one per retry, so the cap was never reached)."""

    def __init__(self, kind: str, retries: int) -> None:
        self.kind, self.retries, self.count = kind, retries, 0

    def on_timeout(self) -> AckDecision:
        if self.kind == "skip":
            return AckDecision(True, 0)
        self.count += 1
        if self.retries and self.count > self.retries:
            return AckDecision(True, self.count)
        return AckDecision(False, self.count)


class AppState:
    """``{client}_app`` (HASH, hash tag = client id): ``sent`` = the highest offset handed to the wire (DUP on a
    resend), ``rel:<offset>`` = a QoS 2 message the client answered with PUBREC (PUBREL is resent, not it)."""

    def __init__(self, store, client_id: str) -> None:
        self.redis = store.redis
        self.key = f"{store.config.key_prefix}{{{client_id}}}_app"

    async def load(self) -> tuple[int, set[int]]:
        fields = await self.redis.hgetall(self.key)
        sent, released = -1, set()
        for name, value in fields.items():
            name = name.decode() if isinstance(name, bytes) else name
            if name == "sent":
                sent = int(value)
            elif name.startswith("rel:"):
                released.add(int(name[4:]))
        return sent, released

    async def reset(self) -> None:
        await self.redis.delete(self.key)

    async def mark_sent(self, offset: int) -> None:
        await self.redis.hset(self.key, "sent", offset)

    async def mark_released(self, offset: int) -> None:
        await self.redis.hset(self.key, f"rel:{offset}", 1)

    async def forget_released(self, offsets: list[int]) -> None:
        if offsets:
            await self.redis.hdel(self.key, *(f"rel:{o}" for o in offsets))


class ApplicationDelivery:
    """The per-connection consumer of a persistent APPLICATION client's topic (the delivery loop of such a
    session: the Redis queue is not used)."""

    def __init__(self, conn: Any, resumed: bool) -> None:  # conn: the client's connection.py Connection
        self.conn = conn
        self.broker = conn.broker
        self.config = conn.config
        self.client_id = conn.client_id
        self.topic = app_topic(conn.client_id)
        self.tp = TopicPartition(self.topic, 0)
        self.resumed = resumed
        self.state = AppState(self.broker.store, conn.client_id)
        self.consumer: AIOKafkaConsumer | None = None
        self.sent_upto = -1
        self.released: set[int] = set()
        self.done: set[int] = set()
        self.progress = asyncio.Event()
        self.committed: int | None = None
        self.pack: list[int] = []  # the offsets of the pack in delivery
        self.task: asyncio.Task | None = None

    # ------------------------------------------------------------ start (before the CONNACK)
    async def init(self) -> None:
        """Topic, consumer, starting offset: before the CONNACK, so a message fanned out after the client's
        SUBSCRIBE is at or after the start (a start taken later could skip it)."""
        await self.broker.ensure_app_topic(self.topic)
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=self.broker.kafka_bootstrap, group_id=app_consumer_group(self.client_id),
            enable_auto_commit=False, auto_offset_reset="earliest", request_timeout_ms=30000,
            fetch_max_wait_ms=self.config.kafka_fetch_max_wait_ms,
            max_poll_records=self.config.application_poll_max_records)
        await self.consumer.start()
        try:
            self.consumer.assign([self.tp])
            if self.resumed:
                self.sent_upto, self.released = await self.state.load()
                if self.config.has("app_resend_without_dup"):
                    self.sent_upto = -1  # the `sent` mark not read: what went out before counts as never sent
                committed = await self.consumer.committed(self.tp)
                if self.config.has("app_backlog_from_end"):
                    await self.consumer.seek_to_end(self.tp)  # as for a new session: the backlog is skipped
                elif committed is None:
                    await self.consumer.seek_to_beginning(self.tp)  # never committed: all of it (duplicates, no loss)
                else:
                    self.consumer.seek(self.tp, committed)
                self.committed = committed
            else:
                # a new session starts at the end (TBMQ commits the end offset of a fresh consumer); Tansu's
                # end offset can be short of the truth, and what an older session left there carries its
                # "gen" and is skipped
                await self.state.reset()
                await self.consumer.seek_to_end(self.tp)
                start = await self.consumer.position(self.tp)
                await self.consumer.commit({self.tp: start})
                self.committed = start
            log.info("%s: APPLICATION topic %s from offset %s (%s)", self.client_id, self.topic, self.committed,
                     "resumed" if self.resumed else "new session")
        except BaseException:
            await self.stop()
            raise

    def start(self) -> asyncio.Task:
        """The delivery task (after the CONNACK); ``finish`` ends it."""
        self.task = asyncio.create_task(self.run())
        return self.task

    async def finish(self) -> None:
        """The connection ended.  What its client acknowledged of the pack is committed before the node releases
        the session: the delivery task, cancelled between two commits (they come at most every 0.1 s while acks
        arrive), would leave the pack's last acks uncommitted, and the resumed session would read them again
        (docs/findings.md).  The fence in ``commit_prefix`` still holds: a taken-over connection commits nothing."""
        task, self.task = self.task, None
        try:
            if task is not None:
                task.cancel()
                await asyncio.wait([task])
            if self.pack and self.consumer is not None:
                # bounded: with Kafka or Redis away the commit would hold the connection's end (its Will, the
                # session's release) for the request timeout; uncommitted acks cost duplicates, never loss
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.commit_prefix(self.pack), FINAL_COMMIT_TIMEOUT_S)
        finally:
            await self.stop()

    async def stop(self) -> None:
        if self.consumer is not None:
            consumer, self.consumer = self.consumer, None
            with contextlib.suppress(Exception):
                await consumer.stop()

    # ------------------------------------------------------------ packs
    async def run(self) -> None:
        try:
            while not self.conn.closed:
                room = min(self.conn.window - len(self.conn.inflight), self.config.application_poll_max_records)
                if room <= 0:
                    await asyncio.sleep(0.05)
                    continue
                try:
                    batch = await self.consumer.getmany(self.tp, timeout_ms=200, max_records=room)
                except Exception as error:
                    log.warning("%s: APPLICATION topic poll failed: %r", self.client_id, error)
                    await asyncio.sleep(0.5)
                    continue
                records = batch.get(self.tp, [])
                if records:
                    await self.process_pack(records)
        except ConnectionError:
            pass
        except Exception:
            # what went out of this pack is unknown now: end the connection, the client's reconnect resends
            # from the committed offset with DUP = 1 (a resend on this connection is not allowed)
            log.exception("%s: APPLICATION delivery failed; closing the connection", self.client_id)
            await self.conn.close(codec.RC_UNSPECIFIED_ERROR)
        # the consumer stays open: the connection's end commits what was acknowledged, then stops it (finish)

    async def process_pack(self, records: list[Any]) -> None:
        conn = self.conn
        offsets = self.pack = [r.offset for r in records]
        self.done = set()
        to_send = []
        now_ms = time.time() * 1000
        for record in records:
            message = orjson.loads(record.value)
            if message.get("gen") not in (None, conn.session_gen):
                self.done.add(record.offset)  # fanned out for an earlier session of this client ([MQTT-3.1.2-4])
                continue
            expires_at = message.get("expiresAt")
            if expires_at is not None and expires_at <= now_ms and not self.config.has("ignore_message_expiry"):
                self.done.add(record.offset)  # expired: never sent
                continue
            to_send.append((record.offset, message))
        if to_send:
            # recorded before the bytes go out: a crash in between gives DUP = 1 on a first delivery, never
            # DUP = 0 on a resend.  Nothing is sent until it is recorded (Redis failing over: retried).
            while True:
                try:
                    await self.state.mark_sent(max(self.sent_upto, to_send[-1][0]))
                    break
                except Exception as error:
                    if conn.closed:
                        return
                    log.warning("%s: recording the APPLICATION pack as sent failed: %r; retrying", self.client_id,
                                error)
                    await asyncio.sleep(0.5)
        for offset, message in to_send:
            pid = packet_id_for(offset)
            while conn.inflight.get(pid, ("", ""))[0] in ("live", "shared") and not conn.closed:
                await asyncio.sleep(0.02)  # a live or shared-group delivery holds this id for now
            dup = offset <= self.sent_upto or offset in self.released
            if offset in self.released:
                conn.inflight[pid] = ("apprel", str(offset))
                conn.send(Ack(codec.PUBREL, pid))  # PUBREC came before the reconnect: PUBREL again
                continue
            remaining = conn._remaining_expiry(message)
            if self.config.has("no_dup_on_resend"):
                dup = False
            if not conn.send_publish(conn._publish(message, message["qos"], pid, dup, remaining)):
                self.done.add(offset)  # [MQTT-3.1.2-25]: too large for the client, as if delivered
                continue
            conn.inflight[pid] = ("app", str(offset))
        self.sent_upto = max(self.sent_upto, to_send[-1][0]) if to_send else self.sent_upto
        conn.flush()
        await conn.writer.drain()
        await self.await_pack(offsets)

    async def await_pack(self, offsets: list[int]) -> None:
        strategy = AckStrategy(self.config.application_ack_strategy, self.config.application_retries)
        timeout = self.config.application_pack_timeout_s
        deadline = time.monotonic() + timeout
        while True:
            await self.commit_prefix(offsets)
            if all(o in self.done for o in offsets) or self.conn.closed:
                await self.commit_prefix(offsets)  # acks that came during the commit above
                return
            self.progress.clear()
            left = deadline - time.monotonic()
            if left > 0:
                with contextlib.suppress(asyncio.TimeoutError):
                    # a commit at most every 0.1 s while acks come in: a disconnect leaves little uncommitted
                    await asyncio.wait_for(self.progress.wait(), min(left, 1.0))
                    await asyncio.sleep(0.1)
                continue
            missing = [o for o in offsets if o not in self.done]
            decision = strategy.on_timeout()
            if not decision.commit_all:
                log.warning("%s: %d of %d messages of the pack (offsets %d..%d) unacknowledged after %.1f s; "
                            "retry %d of %s: waiting again (they are resent, DUP = 1, when the client "
                            "reconnects)", self.client_id, len(missing), len(offsets), offsets[0], offsets[-1],
                            timeout, decision.retry, self.config.application_retries or "unlimited")
                deadline = time.monotonic() + timeout
                continue
            # a give-up is never silent (TBMQ #320 skipped at DEBUG)
            log.error("%s: giving up on %d unacknowledged messages of APPLICATION topic %s (offsets %s) after %s; "
                      "committing over them", self.client_id, len(missing), self.topic, _ranges(missing),
                      f"{decision.retry - 1} retries" if decision.retry else "the pack timeout (skip)")
            self.broker.stats["app_skipped"] += len(missing)
            for offset in missing:
                pid = packet_id_for(offset)
                if self.conn.inflight.get(pid, ("", ""))[1] == str(offset):
                    self.conn.inflight.pop(pid, None)
            self.done.update(missing)
            await self.commit_prefix(offsets)
            return

    async def commit_prefix(self, offsets: list[int]) -> None:
        end = acked_prefix_end(offsets, self.done)
        if end is None or (self.committed is not None and end <= self.committed):
            return
        # fencing: a connection that lost the session (takeover, maybe on another node) commits nothing more;
        # its older offsets would move the newer connection's progress back
        try:
            session = await self.broker.store.get_session(self.client_id)
            if session.get("conn") != self.conn.conn_id:
                return
            await self.consumer.commit({self.tp: end})
        except Exception as error:  # the next commit covers it; meanwhile a reconnect may duplicate
            log.warning("%s: commit of APPLICATION topic offset %d failed: %r", self.client_id, end, error)
            return
        self.committed = end
        released = [o for o in offsets if o < end and o in self.released]
        if released:
            self.released -= set(released)
            with contextlib.suppress(Exception):
                await self.state.forget_released(released)

    # ------------------------------------------------------------ acknowledgements (from the connection)
    async def on_ack(self, packet_type: int, pid: int, entry: tuple[str, str], reason_code: int) -> None:
        offset = int(entry[1])
        conn = self.conn
        if packet_type == codec.PUBREC and reason_code < 0x80:
            if entry[0] == "app":
                with contextlib.suppress(Exception):
                    await self.state.mark_released(offset)
                self.released.add(offset)
                conn.inflight[pid] = ("apprel", entry[1])
            conn.send(Ack(codec.PUBREL, pid))
            return
        # PUBACK, PUBCOMP, or a PUBREC refusing the message: its flow is over
        self.done.add(offset)
        conn._flow_ended(pid)
        self.progress.set()


def _ranges(offsets: list[int]) -> str:
    parts, start = [], None
    for i, offset in enumerate(offsets):
        if start is None:
            start = offset
        if i + 1 == len(offsets) or offsets[i + 1] != offset + 1:
            parts.append(str(start) if start == offset else f"{start}..{offset}")
            start = None
    return ", ".join(parts)
