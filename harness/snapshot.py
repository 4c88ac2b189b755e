"""White-box access to the reference broker's Redis state (docs/history.md, kind ``session_snapshot``).

Keys (docs/tbmq-notes.md, reference_broker/store.py), all sharing the client id as hash tag:
``<prefix>{client}_messages`` ZSET (member = payload key, score = never-wrapping counter),
``<prefix>{client}_messages_<packet id>`` payload STRING with TTL, ``<prefix>{client}_last_packet_id``.

``snapshot_sessions`` records one ``session_snapshot`` row per subscriber after the drain: ZSET size, the
last packet id, orphan payload keys (no ZSET member points at them) and dangling references (ZSET members
whose payload key is gone), with the members, scores, TTLs and decoded identities in ``detail``.

``QueueSizeProbe`` records a smaller ``session_snapshot`` row — the ZSET size only, ``detail.when =
"before_reconnect"`` — just before a persistent subscriber comes back, so "more kept than the limit" is seen
while the backlog is largest, not only after the drain emptied it.  Only the size: the other white-box
counts are meaningful once nothing is in flight.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from contracts import payload as identity_codec
from contracts.history_schema import Kind
from harness.history import HistoryRecorder

MAX_MEMBERS_IN_DETAIL = 20000


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def messages_key(prefix: str, client: str) -> str:
    return f"{prefix}{{{client}}}_messages"


def last_packet_id_key(prefix: str, client: str) -> str:
    return f"{prefix}{{{client}}}_last_packet_id"


def _cluster(startup_nodes: Sequence[tuple[str, int]]):
    from redis.cluster import ClusterNode, RedisCluster

    return RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in startup_nodes], decode_responses=True,
                        socket_timeout=10)


def preset_last_packet_ids(startup_nodes: Sequence[tuple[str, int]], prefix: str,
                           presets: Mapping[str, int]) -> None:
    """Start these sessions' packet ids at the given values (the wraparound scenarios)."""
    cluster = _cluster(startup_nodes)
    try:
        for client, last in presets.items():
            cluster.set(last_packet_id_key(prefix, client), int(last))
    finally:
        cluster.close()


def read_session(cluster: Any, prefix: str, client: str) -> dict[str, Any]:
    """The Redis state of one session, with the white-box counts."""
    zset = messages_key(prefix, client)
    members: list[tuple[str, float]] = cluster.zrange(zset, 0, -1, withscores=True)
    last = cluster.get(last_packet_id_key(prefix, client))
    node = cluster.get_node_from_key(zset)
    connection = cluster.get_redis_connection(node)
    payload_keys = {k for k in connection.scan_iter(match=_glob_escape(zset) + "_*", count=1000)
                    if k[len(zset) + 1:].isdigit()}
    member_names = {m for m, _ in members}
    orphans = sorted(payload_keys - member_names)
    dangling = sorted(member_names - payload_keys)
    entries = []
    for member, score in members[:MAX_MEMBERS_IN_DETAIL]:
        entry: dict[str, Any] = {"key": member, "score": score}
        if member in payload_keys:
            entry["ttl_ms"] = connection.pttl(member)
            entry.update(_identity_of(connection.get(member)))
        entries.append(entry)
    return {
        "client": client,
        "zset_size": len(members),
        "last_packet_id": int(last) if last is not None else None,
        "orphan_payloads": len(orphans),
        "dangling_refs": len(dangling),
        "detail": {"members": entries, "members_truncated": len(members) > MAX_MEMBERS_IN_DETAIL,
                   "orphans": orphans[:1000], "dangling": dangling[:1000],
                   "min_score": members[0][1] if members else None,
                   "max_score": members[-1][1] if members else None},
    }


def _identity_of(raw: str | None) -> dict[str, Any]:
    if raw is None:
        return {}
    try:
        message = json.loads(raw)
        body = base64.b64decode(message.get("payload", ""))
    except (ValueError, TypeError, AttributeError):
        return {"unreadable": True}
    out: dict[str, Any] = {"packet_id": message.get("packetId"), "topic": message.get("topic")}
    identity = identity_codec.try_decode(body)
    if identity is not None:
        out.update(publisher_index=identity.publisher_index, pub_seq=identity.seq,
                   body_hash=identity_codec.body_hash(body))
    return out


def snapshot_sessions(startup_nodes: Sequence[tuple[str, int]], prefix: str, clients: Iterable[str],
                      recorder: HistoryRecorder) -> int:
    """Record one session_snapshot row per client; returns how many were recorded."""
    cluster = _cluster(startup_nodes)
    count = 0
    try:
        for client in clients:
            state = read_session(cluster, prefix, client)
            recorder.record(Kind.SESSION_SNAPSHOT, client=client, zset_size=state["zset_size"],
                            last_packet_id=state["last_packet_id"], orphan_payloads=state["orphan_payloads"],
                            dangling_refs=state["dangling_refs"], detail=state["detail"])
            count += 1
    finally:
        cluster.close()
    return count


PRESET_ATTEMPTS = 4
PRESET_RETRY_S = 0.015  # the executor's loop waits at most attempts x this (it runs on the loop thread)

# KEYS: the messages ZSET, the last packet id; ARGV[1]: the new last packet id.  Returns {previous id (false
# if unset), queue size, 1 if set}.  Both keys share the client's hash tag: one slot, one atomic step.
PRESET_IF_EMPTY = """
local previous = redis.call('GET', KEYS[2])
local size = redis.call('ZCARD', KEYS[1])
if size == 0 then
  redis.call('SET', KEYS[2], ARGV[1])
  return {previous or false, size, 1}
end
return {previous or false, size, 0}
"""


class QueueSizeProbe:
    """``probe(client, why)``: record the size of the client's message ZSET right now (a ``session_snapshot``
    row with only ``zset_size``).  Best effort and quick: one ZCARD with a 1 s timeout; when Redis does not
    answer (a fault is running) nothing is recorded and the run goes on — the probe adds evidence, the
    post-drain snapshot stays the one that must exist."""

    def __init__(self, startup_nodes: Sequence[tuple[str, int]], prefix: str, recorder: HistoryRecorder):
        self.startup_nodes = list(startup_nodes)
        self.prefix = prefix
        self.recorder = recorder
        self._cluster: Any = None
        self.recorded = 0
        self.failed = 0
        self.presets_applied = 0

    def _connect(self) -> Any:
        if self._cluster is None:
            from redis.cluster import ClusterNode, RedisCluster

            self._cluster = RedisCluster(
                startup_nodes=[ClusterNode(h, p) for h, p in self.startup_nodes], decode_responses=True,
                socket_timeout=1.0, socket_connect_timeout=1.0)
        return self._cluster

    def __call__(self, client: str, why: str) -> None:
        try:
            size = int(self._connect().zcard(messages_key(self.prefix, client)))
        except Exception:  # noqa: BLE001 - any Redis trouble: no probe row, the run is not disturbed
            self.failed += 1
            return
        self.recorder.record(Kind.SESSION_SNAPSHOT, client=client, zset_size=size,
                             detail={"when": "before_reconnect", "why": why})
        self.recorded += 1

    def preset_if_empty(self, client: str, last_packet_id: int) -> None:
        """preset_each_offline: set the session's last packet id to ``last_packet_id`` if its message queue is
        empty (tried ``PRESET_ATTEMPTS`` times, shortly before a planned disconnect) (nothing in flight, nothing queued: no stored packet id can collide, and the broker
        reads an emptied queue from its start), atomically with that check.  The next offline backlog then
        crosses the wrap, as the first one did.  Recorded as a ``session_snapshot`` row with
        ``detail.when = "preset"`` (the id only in ``detail``: the last_packet_id column is the stored id the
        white-box rules judge after the drain); a queue that was not empty leaves the id alone
        (``applied`` false)."""
        try:
            cluster = self._connect()
            script = cluster.register_script(PRESET_IF_EMPTY)
            keys = [messages_key(self.prefix, client), last_packet_id_key(self.prefix, client)]
            for attempt in range(PRESET_ATTEMPTS):
                # Why retry: a connected subscriber's queue empties whenever its in-flight messages are acked
                # (milliseconds); a message caught in flight is no reason to skip this window's wrap.
                previous, size, applied = script(keys=keys, args=[int(last_packet_id)])
                if applied or attempt == PRESET_ATTEMPTS - 1:
                    break
                time.sleep(PRESET_RETRY_S)
        except Exception as error:  # noqa: BLE001 - Redis trouble (a fault is running): say so, go on
            self.failed += 1
            self.recorder.record(Kind.SESSION_SNAPSHOT, client=client, detail={
                "when": "preset", "applied": False, "preset_last_packet_id": int(last_packet_id),
                "error": f"{type(error).__name__}: {error}"})
            return
        self.recorder.record(Kind.SESSION_SNAPSHOT, client=client, zset_size=int(size), detail={
            "when": "preset", "applied": bool(applied), "preset_last_packet_id": int(last_packet_id),
            "previous_last_packet_id": None if previous is None else int(previous)})
        self.presets_applied += int(bool(applied))

    def close(self) -> None:
        if self._cluster is not None:
            try:
                self._cluster.close()
            finally:
                self._cluster = None
