"""Everything the broker keeps in Redis Cluster.

Per client (hash tag = client id, so one Lua script may touch them all):
  <prefix>{client}_messages          ZSET  member = payload key, score = never-wrapping counter
  <prefix>{client}_messages_<pid>    STRING the message JSON, SET ... EX ttl
  <prefix>{client}_last_packet_id    STRING last packet id handed out
  <prefix>{client}_sent              HASH  payload key -> "<score> <connection id>" when read to be sent (DUP flag)
  <prefix>{client}_session           HASH  node, conn, persistent, expiry, disconnected_at, gen, score
                                           (score: the highest message score given, lua/save.lua)
  <prefix>{client}_inbound_qos2      SET   QoS 2 packet ids received from the client, PUBREL pending
  <prefix>{client}_will              STRING a delayed Will Message (JSON), pending until its Will Delay runs out
  <prefix>{client}_will_conn         STRING the Will of the open connection (JSON {conn, will, delay}): taken
                                           (TAKE_CONNECTED_WILL) by whoever decides about it -- the connection's
                                           own end, the client's next CONNECT, the release of a dead node
Retained messages (hash tag {retained}, one slot apart from the shared keys):
  <prefix>{retained}:messages        HASH  topic -> the retained message JSON (as on the incoming topic)
Shared by every node (hash tag {ordeal}):
  <prefix>{ordeal}:subscriptions     HASH  client -> JSON {node, persistent, filters{filter: qos}}
  <prefix>{ordeal}:subs_version      STRING bumped after every subscription change
  <prefix>{ordeal}:session_expiry    ZSET  client -> epoch ms when its disconnected session expires
  <prefix>{ordeal}:nodes             HASH  node id -> JSON {peer, ts}
  <prefix>{ordeal}:clients:<node>    SET   clients with a connection on that node
  <prefix>{ordeal}:lease:<topic>:<p> STRING node id owning that partition (PX lease)
  <prefix>{ordeal}:wills             ZSET  client -> epoch ms when its pending delayed Will is due

The scripts in lua/ (and the inline TAKE_CONNECTED_WILL) are loaded by SHA (``register_script``), which
reloads on NOSCRIPT after a restart or failover.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from redis.asyncio.cluster import ClusterNode, PipelineCommand, RedisCluster
from redis.exceptions import AskError, NoScriptError, ResponseError

from reference_broker.codec import topic_matches
from reference_broker.config import BrokerConfig
from reference_broker.defects import CATALOG
from reference_broker.script_batch import ScriptBatcher

LUA_DIR = Path(__file__).resolve().parent.parent / "lua"
SCRIPT_NAMES = ("save", "read_backlog", "remove_one", "mark_released", "remove_all", "lease", "replace_session",
                "mark_disconnected", "delete_session_if_owned")
# the defects the save script carries, passed to it as ARGV[4]: from the catalog (one source), so a new
# save-script defect cannot be left out (one missing from a hand-kept list would be switched on and never
# reach the script)
SAVE_DEFECTS = tuple(name for name, defect in CATALOG.items() if defect.where == "lua/save.lua")


# take_connected_will: remove the client's connected-Will record and return it, in one step, if connection
# ARGV[1] owns it (ARGV[2] = 'own') or if another connection does (ARGV[2] = 'other': a new CONNECT claims
# what an older connection left); false otherwise.  One compare-and-delete, so of the nodes and connections
# racing for a record exactly one gets it -- and only that one publishes the Will.
# KEYS[1] = <prefix>{client}_will_conn
TAKE_CONNECTED_WILL = """
local raw = redis.call('GET', KEYS[1])
if not raw then
  return false
end
local owned = cjson.decode(raw)['conn'] == ARGV[1]
if owned ~= (ARGV[2] == 'own') then
  return false
end
redis.call('DEL', KEYS[1])
return raw
"""


def lua_source(name: str) -> str:
    return (LUA_DIR / f"{name}.lua").read_text()


class WaitShortfall(RuntimeError):
    """WAIT returned fewer replica acknowledgements than configured."""


@dataclass(frozen=True)
class SaveResult:
    previous_last_packet_id: int
    last_packet_id: int
    stored: int
    trimmed: int


@dataclass(frozen=True)
class StoredMessage:
    score: float
    message: dict[str, Any]
    sent_before: bool   # it had been sent already (the resend carries DUP = 1)

    @property
    def packet_id(self) -> int:
        return int(self.message["packetId"])


class SessionStore:
    def __init__(self, redis: RedisCluster, config: BrokerConfig) -> None:
        self.redis = redis
        self.config = config
        self.prefix = config.key_prefix
        self.scripts = {name: redis.register_script(lua_source(name)) for name in SCRIPT_NAMES}
        self.take_will_script = redis.register_script(TAKE_CONNECTED_WILL)
        self.batch = ScriptBatcher(redis)  # the per-message scripts: one pipeline per master per loop turn
        self.save_defects = ",".join(d for d in config.defects if d in SAVE_DEFECTS)
        self._fsync_off_at = float("-inf")  # defect ack_before_durable: when it last turned fsync off
        self._node_retained: dict[str, bytes] = {}  # defect retained_in_node_memory: topic -> message JSON

    # ------------------------------------------------------------ key names
    def messages_key(self, client: str) -> str:
        return f"{self.prefix}{{{client}}}_messages"

    def last_packet_id_key(self, client: str) -> str:
        return f"{self.prefix}{{{client}}}_last_packet_id"

    def sent_key(self, client: str) -> str:
        return f"{self.prefix}{{{client}}}_sent"

    def session_key(self, client: str) -> str:
        return f"{self.prefix}{{{client}}}_session"

    def shared_key(self, name: str) -> str:
        return f"{self.prefix}{{ordeal}}:{name}"

    # ------------------------------------------------------------ the message scripts
    async def save(self, client: str, messages: list[dict[str, Any]]) -> SaveResult:
        keys = [self.messages_key(client), self.last_packet_id_key(client), self.sent_key(client),
                self.session_key(client)]
        args = [self.config.persisted_messages_limit, orjson.dumps(messages),
                self.config.persisted_message_ttl_s, self.save_defects]
        if self.config.has("ack_before_durable") and time.monotonic() - self._fsync_off_at > 1.0:
            self._fsync_off_at = time.monotonic()  # a restarted node reads its config file again: repeat
            try:
                await self.redis.config_set("appendfsync", "no", target_nodes=RedisCluster.ALL_NODES)
            except Exception:  # noqa: BLE001 - a node down: the next save tries again
                pass
        if self.config.redis_wait_replicas:
            result = await self._save_and_wait(keys, args)
        else:
            result = await self.batch.call(self.scripts["save"], keys, args)
        return SaveResult(*(int(x) for x in result))

    async def _save_and_wait(self, keys: list[str], args: list[Any]) -> list[Any]:
        """EVALSHA and WAIT on one connection to the key's master (WAIT counts that connection's writes)."""
        script = self.scripts["save"]
        for _attempt in range(3):
            # the master is looked up on every attempt: a refresh below may have moved the slot
            node: ClusterNode = self.redis.get_node_from_key(keys[0])
            commands = [PipelineCommand(0, "EVALSHA", script.sha, len(keys), *keys, *args),
                        PipelineCommand(1, "WAIT", self.config.redis_wait_replicas,
                                        self.config.redis_wait_timeout_ms)]
            try:
                await node.execute_pipeline(commands)
            except Exception:
                await self.redis.nodes_manager.initialize()  # the node may be gone: refresh the slot map
                raise
            saved, waited = commands[0].result, commands[1].result
            if isinstance(saved, NoScriptError):
                await node.execute_command("SCRIPT", "LOAD", script.script)
                continue
            if isinstance(saved, AskError):
                # MOVED (or ASK): this pipeline bypasses RedisCluster's own redirection handling, so the
                # slot map stays stale until refreshed here -- e.g. an old master back as a replica after a
                # failover answers MOVED to every save.  redis-py strips the "MOVED" prefix from the
                # message, so the type is what tells.  Nothing was written: refresh and try again.
                await self.redis.nodes_manager.initialize()
                continue
            if isinstance(saved, Exception):
                raise saved
            if isinstance(waited, Exception):
                raise waited
            if int(waited) < self.config.redis_wait_replicas:
                raise WaitShortfall(f"WAIT {self.config.redis_wait_replicas}: only {waited} replica(s) "
                                    f"acknowledged within {self.config.redis_wait_timeout_ms} ms")
            return saved
        raise ResponseError(f"save script for {keys[0]} not run: no master took it after 3 attempts "
                            "(redirected or script missing)")

    async def read(self, client: str, after_score: str = "-inf", limit: int = 0,
                   mark_sent: bool = True, reader: str = "") -> list[StoredMessage]:
        """Stored messages in score order after ``after_score`` (exclusive), dropping dangling references;
        with ``mark_sent`` they are recorded as sent by connection ``reader`` before they go out, so another
        connection's later read (a resend after a reconnect) gets DUP = 1 -- and a read of the same connection
        whose reply was lost does not (lua/read_backlog.lua)."""
        raw = await self.batch.call(self.scripts["read_backlog"], [self.messages_key(client), self.sent_key(client)],
                                    [after_score, limit, 1 if mark_sent else 0, reader])
        out = []
        for i in range(0, len(raw), 3):
            score, payload, sent = raw[i], raw[i + 1], raw[i + 2]
            out.append(StoredMessage(float(score), orjson.loads(payload), bool(int(sent))))
        return out

    async def remove_one(self, client: str, packet_id: int) -> int:
        return int(await self.batch.call(self.scripts["remove_one"], [self.messages_key(client), self.sent_key(client)],
                                         [packet_id]))

    async def mark_released(self, client: str, packet_id: int) -> int:
        return int(await self.batch.call(self.scripts["mark_released"], [self.messages_key(client)], [packet_id]))

    async def remove_all(self, client: str) -> int:
        removed = int(await self.scripts["remove_all"](
            keys=[self.messages_key(client), self.last_packet_id_key(client), self.sent_key(client),
                  self.session_key(client)]))
        await self.redis.delete(self.inbound_qos2_key(client))
        return removed

    # ------------------------------------------------------------ inbound QoS 2 (publisher side)
    def inbound_qos2_key(self, client: str) -> str:
        return f"{self.prefix}{{{client}}}_inbound_qos2"

    async def add_inbound_qos2(self, client: str, packet_id: int) -> None:
        await self.redis.sadd(self.inbound_qos2_key(client), packet_id)

    async def remove_inbound_qos2(self, client: str, packet_id: int) -> None:
        await self.redis.srem(self.inbound_qos2_key(client), packet_id)

    async def inbound_qos2(self, client: str) -> set[int]:
        return {int(x) for x in await self.redis.smembers(self.inbound_qos2_key(client))}

    # ------------------------------------------------------------ sessions
    async def get_session(self, client: str) -> dict[str, str]:
        raw = await self.redis.hgetall(self.session_key(client))
        return {k.decode(): v.decode() for k, v in raw.items()}

    def state_keys(self, client: str) -> list[str]:
        """A session's state besides its record (messages ZSET first, as the scripts expect)."""
        return [self.messages_key(client), self.last_packet_id_key(client), self.sent_key(client),
                self.inbound_qos2_key(client)]

    async def put_session(self, client: str, fields: dict[str, Any], discard: bool = False) -> None:
        """Replace the session record in one step (lua/replace_session.lua says why); with ``discard`` the
        previous session's queue and state go in the same step (a new session)."""
        flat = [str(x) for item in fields.items() for x in item]
        keys = [self.session_key(client)] + (self.state_keys(client) if discard else [])
        await self.scripts["replace_session"](keys=keys, args=flat)

    async def end_session_if_owned(self, client: str, conn: str) -> bool:
        """Delete the record and the whole state of a session that ``conn`` still owns ('' = a disconnected
        session), in one step; returns whether it did."""
        keys = [self.session_key(client)] + self.state_keys(client)
        if not int(await self.scripts["delete_session_if_owned"](keys=keys, args=[conn])):
            return False
        await self.redis.zrem(self.shared_key("session_expiry"), client)
        return True

    async def mark_disconnected(self, client: str, conn: str, expires_at_ms: int | None,
                                expiry_s: int | None | str = "keep") -> bool:
        """Mark the session disconnected if ``conn`` still owns it; returns whether it did.  ``expiry_s`` is
        the interval in force (None = never), recorded for the next CONNECT's expiry check ("keep": as is)."""
        args = [conn, int(time.time() * 1000)]
        if expiry_s != "keep":
            args.append("" if expiry_s is None else expiry_s)
        owned = await self.scripts["mark_disconnected"](keys=[self.session_key(client)], args=args)
        if not int(owned):
            return False
        if expires_at_ms is not None:
            await self.redis.zadd(self.shared_key("session_expiry"), {client: expires_at_ms})
        return True

    async def delete_session_if_owned(self, client: str, conn: str) -> bool:
        """Delete the session record only if ``conn`` still owns it; returns whether it did."""
        if not int(await self.scripts["delete_session_if_owned"](keys=[self.session_key(client)], args=[conn])):
            return False
        await self.redis.zrem(self.shared_key("session_expiry"), client)
        return True

    async def delete_session(self, client: str) -> None:
        await self.redis.delete(self.session_key(client))
        await self.redis.zrem(self.shared_key("session_expiry"), client)

    async def cancel_expiry(self, client: str) -> None:
        await self.redis.zrem(self.shared_key("session_expiry"), client)

    async def due_expiries(self, now_ms: int) -> list[str]:
        raw = await self.redis.zrangebyscore(self.shared_key("session_expiry"), "-inf", now_ms)
        return [c.decode() for c in raw]

    async def claim_expiry(self, client: str) -> bool:
        """Several nodes sweep; the one whose ZREM removed the entry does the work."""
        return bool(await self.redis.zrem(self.shared_key("session_expiry"), client))

    # ------------------------------------------------------------ subscriptions
    async def subscriptions_version(self) -> int:
        return int(await self.redis.get(self.shared_key("subs_version")) or 0)

    async def all_subscriptions(self) -> dict[str, dict[str, Any]]:
        raw = await self.redis.hgetall(self.shared_key("subscriptions"))
        return {k.decode(): json.loads(v) for k, v in raw.items()}

    async def get_subscription(self, client: str) -> dict[str, Any] | None:
        raw = await self.redis.hget(self.shared_key("subscriptions"), client)
        return json.loads(raw) if raw else None

    async def put_subscription(self, client: str, record: dict[str, Any] | None) -> None:
        # write, then bump the version: a fan-out that sees the new version also sees the write
        if record is None:
            if not await self.redis.hdel(self.shared_key("subscriptions"), client):
                return  # nothing changed: no version bump, so no fan-out reloads every subscription
        else:
            await self.redis.hset(self.shared_key("subscriptions"), client, json.dumps(record))
        await self.redis.incr(self.shared_key("subs_version"))

    # ------------------------------------------------------------ retained messages
    def retained_key(self) -> str:
        return f"{self.prefix}{{retained}}:messages"

    async def put_retained(self, message: dict[str, Any]) -> None:
        """Store a retained message for its topic, or delete the topic's with an empty payload
        ([MQTT-3.3.1-10], -11)."""
        if self.config.has("retained_in_node_memory"):  # defect: this node's memory, not Redis
            if message["payload"]:
                self._node_retained[message["topic"]] = orjson.dumps(message)
            else:
                self._node_retained.pop(message["topic"], None)
            return
        if message["payload"]:
            await self.redis.hset(self.retained_key(), message["topic"], orjson.dumps(message))
        else:
            await self.redis.hdel(self.retained_key(), message["topic"])

    async def retained_matching(self, topic_filter: str) -> list[dict[str, Any]]:
        """The retained messages whose topic ``topic_filter`` matches ($-topics only by a filter that starts with
        their first level, codec.topic_matches), in topic order.  One HGETALL per SUBSCRIBE: the whole set is
        read (a broker with very many retained topics would keep an index of them instead, as TBMQ keeps a
        trie in each node's memory)."""
        if self.config.has("retained_in_node_memory"):  # defect: only what this node stored since it started
            return [orjson.loads(self._node_retained[t]) for t in sorted(self._node_retained)
                    if topic_matches(topic_filter, t)]
        if "+" not in topic_filter and "#" not in topic_filter:
            raw = await self.redis.hget(self.retained_key(), topic_filter)
            return [orjson.loads(raw)] if raw else []
        every = await self.redis.hgetall(self.retained_key())
        return [orjson.loads(every[t]) for t in sorted(every) if topic_matches(topic_filter, t.decode())]

    # ------------------------------------------------------------ delayed Will Messages
    def will_key(self, client: str) -> str:
        return f"{self.prefix}{{{client}}}_will"

    async def put_pending_will(self, client: str, message: dict[str, Any], due_ms: int) -> None:
        """The Will first, then its due time: a node dying in between leaves only a key that expires."""
        ttl = max(1, (due_ms - int(time.time() * 1000)) // 1000 + 86400)
        await self.redis.set(self.will_key(client), orjson.dumps(message), ex=ttl)
        await self.redis.zadd(self.shared_key("wills"), {client: due_ms})

    async def pending_will_due_ms(self, client: str) -> int | None:
        """When the client's pending Will is due (epoch ms), None when there is none."""
        score = await self.redis.zscore(self.shared_key("wills"), client)
        return None if score is None else int(score)

    async def take_pending_will(self, client: str) -> dict[str, Any] | None:
        """Claim the client's pending Will (the node whose ZREM removed it has it; a sweep and a reconnect
        race for it) and remove it; None when there is none (or another node claimed it)."""
        if not await self.redis.zrem(self.shared_key("wills"), client):
            return None
        raw = await self.redis.get(self.will_key(client))
        await self.redis.delete(self.will_key(client))
        return orjson.loads(raw) if raw else None

    def connected_will_key(self, client: str) -> str:
        return f"{self.prefix}{{{client}}}_will_conn"

    async def put_connected_will(self, client: str, conn: str, message: dict[str, Any], delay_s: int) -> None:
        await self.redis.set(self.connected_will_key(client),
                             orjson.dumps({"conn": conn, "will": message, "delay": delay_s}))

    async def take_connected_will(self, client: str, conn: str) -> tuple[dict[str, Any], int] | None:
        """Remove connection ``conn``'s Will record; returns (Will, delay) if it was still there and that
        connection's (None: none, another connection's, or already taken by a claim or a release)."""
        return await self._take_connected_will(client, conn, "own")

    async def claim_other_connected_will(self, client: str, conn: str) -> tuple[dict[str, Any], int] | None:
        """Remove the Will record another connection than ``conn`` left (the client's new CONNECT, before it
        stores its own); returns (Will, delay), or None when there is none."""
        return await self._take_connected_will(client, conn, "other")

    async def _take_connected_will(self, client: str, conn: str, whose: str) -> tuple[dict[str, Any], int] | None:
        raw = await self.take_will_script(keys=[self.connected_will_key(client)], args=[conn, whose])
        if not raw:
            return None
        record = orjson.loads(raw)
        return record["will"], int(record.get("delay") or 0)

    async def due_wills(self, now_ms: int) -> list[str]:
        raw = await self.redis.zrangebyscore(self.shared_key("wills"), "-inf", now_ms)
        return [c.decode() for c in raw]

    # ------------------------------------------------------------ nodes and partition leases
    async def heartbeat(self, node_id: str, peer: str) -> tuple[dict[str, dict[str, Any]], bool]:
        """Record this node as alive; returns every registered node and whether this one was missing
        (first start, or another node declared it dead while it was paused)."""
        key = self.shared_key("nodes")
        added = await self.redis.hset(key, node_id, json.dumps({"peer": peer, "ts": int(time.time() * 1000)}))
        raw = await self.redis.hgetall(key)
        return {k.decode(): json.loads(v) for k, v in raw.items()}, bool(added)

    async def node_peer(self, node_id: str) -> str | None:
        """The node-link address a registered node published, or None."""
        raw = await self.redis.hget(self.shared_key("nodes"), node_id)
        return json.loads(raw)["peer"] if raw else None

    async def forget_node(self, node_id: str) -> None:
        await self.redis.hdel(self.shared_key("nodes"), node_id)

    async def claim_dead_node(self, node_id: str) -> bool:
        """Several nodes may notice a dead one; the one whose HDEL removed it cleans up after it."""
        return bool(await self.redis.hdel(self.shared_key("nodes"), node_id))

    # which clients a node holds connections for (so a dead node's sessions can be released)
    def node_clients_key(self, node_id: str) -> str:
        return self.shared_key(f"clients:{node_id}")

    async def add_node_client(self, node_id: str, client: str) -> None:
        await self.redis.sadd(self.node_clients_key(node_id), client)

    async def remove_node_client(self, node_id: str, client: str) -> None:
        await self.redis.srem(self.node_clients_key(node_id), client)

    async def take_node_clients(self, node_id: str) -> list[str]:
        key = self.node_clients_key(node_id)
        clients = [c.decode() for c in await self.redis.smembers(key)]
        await self.redis.delete(key)
        return clients

    def lease_key(self, topic: str, partition: int) -> str:
        return self.shared_key(f"lease:{topic}:{partition}")

    async def lease_owners(self, topic: str, partitions: list[int]) -> dict[int, str]:
        if not partitions:
            return {}
        values = await self.redis.mget([self.lease_key(topic, p) for p in partitions])
        return {p: v.decode() for p, v in zip(partitions, values, strict=True) if v is not None}

    async def renew_leases(self, node_id: str, topic: str, wanted: list[int], release: list[int],
                           lease_ms: int) -> set[int]:
        """Acquire or renew the wanted partitions' leases, release ours on ``release``; returns held."""
        keys = [self.lease_key(topic, p) for p in wanted + release]
        if not keys:
            return set()
        flags = ["1"] * len(wanted) + ["0"] * len(release)
        held = await self.scripts["lease"](keys=keys, args=[node_id, lease_ms, *flags])
        return {p for p, ok in zip(wanted, held, strict=False) if int(ok)}
