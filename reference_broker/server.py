"""One reference-broker node: the MQTT listener, the Kafka stages, sessions and node links, wired together.

The node composes its collaborators and they do not import it: a ``Connection`` (connection.py) asks of
it what ``NodeForConnections`` declares, the Kafka stages (kafka_path.py) what ``NodeForKafkaPath``
declares; ``Broker`` provides both."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections import Counter
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer
from redis.asyncio.cluster import ClusterNode, RedisCluster

from reference_broker import codec
from reference_broker.app_clients import APPLICATION
from reference_broker.config import NodeConfig
from reference_broker.connection import Connection
from reference_broker.kafka_path import FanOut, LeasedConsumer, LeaseManager, Persister, ensure_topics
from reference_broker.peers import Peers
from reference_broker.shared_delivery import SharedGroup, ack_entry, start_group_at_end
from reference_broker.shared_subs import parse_shared, shared_topic
from reference_broker.source_address import bind_outgoing_connections
from reference_broker.store import SessionStore

log = logging.getLogger("reference_broker")


class Broker:
    """One node: its sessions (open, lost, released, expired), message routing and lifecycle."""

    def __init__(self, node: NodeConfig, node_id: str, host: str, port: int) -> None:
        self.node = node
        self.config = node.broker
        self.node_id = node_id
        self.host, self.port = host, port
        self.kafka_bootstrap = node.kafka_bootstrap
        self.connections: dict[str, Connection] = {}
        self.stats: Counter[str] = Counter()
        self.peers = Peers(self.on_peer_message)
        self.peer_address = ""
        self.tasks: list[asyncio.Task] = []
        self.redis: RedisCluster | None = None
        self.store: SessionStore | None = None
        self.producer: AIOKafkaProducer | None = None
        self.server: asyncio.base_events.Server | None = None
        self.subscription_nodes: dict[str, str] = {}
        self.app_topics: set[str] = set()  # APPLICATION topics known to exist (created on a client's first CONNECT)
        self.shared_groups: dict[str, SharedGroup] = {}  # '$share/...' -> the group's members on this node
        self.retain_queue: asyncio.Queue = asyncio.Queue()  # (Kafka future, message, done) in publish order
        self.retain_worker: asyncio.Task | None = None
        self.stopping = asyncio.Event()
        self.bound_source = False
        # SIGUSR1 arms a crash point (the nemesis' process_kill with at_stage = "persisted_commit"): the node
        # SIGKILLs itself right after its next persisted-topic commit, the one moment a kill tests the order
        # of save and commit (a random kill lands there on a few percent of tries)
        self.crash_armed = False

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        config = self.config
        # before the first connection: Redis, Kafka and node links leave from this node's own address
        self.bound_source = bind_outgoing_connections(asyncio.get_running_loop(), self.host)
        self.redis = RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in self.node.redis_startup_nodes],
                                  socket_timeout=5.0, socket_connect_timeout=2.0)
        await self.redis.initialize()
        self.store = SessionStore(self.redis, config)
        topics = {config.incoming_topic: config.incoming_partitions,
                  config.persisted_topic: config.persisted_partitions}
        await ensure_topics(self.kafka_bootstrap, topics)
        self.producer = AIOKafkaProducer(
            bootstrap_servers=self.kafka_bootstrap, acks=config.producer_acks if config.producer_acks == "all"
            else int(config.producer_acks), linger_ms=config.producer_linger_ms, enable_idempotence=False,
            max_batch_size=config.producer_max_batch_bytes,
            request_timeout_ms=30000)
        await self.producer.start()
        # aiokafka refreshes metadata for the topics it tracks only once it tracks any: the first send to a topic
        # missing from the start-up metadata (an APPLICATION topic created later) made it track that one alone,
        # dropping the others' leaders -- a batch for them then waited out the request timeout (30 s, then
        # NotLeaderForPartition) while the producer spun on metadata requests.  Track every topic it writes.
        for topic in topics:
            await self.producer.client.add_topic(topic)
        self.peer_address = await self.peers.start(self.host)
        self.leases = LeaseManager(self, topics)
        await self.leases.tick()
        fan_out, persister = FanOut(self), Persister(self)
        self.fan_out_consumer = LeasedConsumer(self, config.incoming_topic, "incoming", fan_out.process)
        self.persist_consumer = LeasedConsumer(self, config.persisted_topic, "persisted", persister.process,
                                               persister.after_commit)
        for coroutine in (self.leases.run(), self.fan_out_consumer.run(), self.persist_consumer.run(),
                          self.expiry_sweeper()):
            self.tasks.append(asyncio.create_task(self._guard(coroutine)))
        self.server = await asyncio.start_server(self._accept, self.host, self.port, limit=1 << 20)
        log.info("broker %s ready on %s:%d (peer link %s, outgoing from %s, defects: %s)", self.node_id,
                 self.host, self.port, self.peer_address, self.host if self.bound_source else "kernel's choice",
                 ", ".join(config.defects) or "none")

    async def _guard(self, coroutine) -> None:
        try:
            await coroutine
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("background task died; stopping the node")
            self.stopping.set()

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
        if self.store is not None:
            log.info("Redis script calls: %d in %d pipelines", self.store.batch.calls, self.store.batch.pipelines)
        for connection in list(self.connections.values()):
            await connection.close(codec.RC_SERVER_UNAVAILABLE)
            with contextlib.suppress(Exception):  # record the disconnect now: the loop ends soon
                await self.connection_lost(connection)
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self.store.forget_node(self.node_id)
            # hand the partitions over now instead of after the lease runs out (consumers are stopped)
            for topic, held in self.leases.held.items():
                await self.store.renew_leases(self.node_id, topic, [], sorted(held), 1)
        await self.peers.stop()
        if self.producer is not None:
            with contextlib.suppress(Exception):
                await self.producer.stop()
        if self.redis is not None:
            with contextlib.suppress(Exception):
                await self.redis.aclose()

    async def serve_forever(self) -> None:
        loop = asyncio.get_running_loop()
        # before start(): a SIGUSR1 that arrives while the node starts must arm, not kill (its default action)
        loop.add_signal_handler(signal.SIGUSR1, self._arm_crash)
        await self.start()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        await self.stopping.wait()
        log.info("broker %s stopping", self.node_id)
        await self.stop()

    def _arm_crash(self) -> None:
        log.warning("crash point armed (SIGUSR1): SIGKILL right after the next persisted-topic commit")
        self.crash_armed = True

    def crash_point(self, stage: str) -> None:
        """Die here if a crash point was armed: no cleanup, no flush of anything but the log."""
        if self.crash_armed:
            log.warning("crash point %s reached: SIGKILL", stage)
            for handler in logging.getLogger().handlers:
                handler.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await Connection(self, reader, writer).run()

    # ------------------------------------------------------------ sessions
    async def ensure_app_topic(self, topic: str) -> None:
        """An APPLICATION client's topic: one partition (its messages in one order), created if missing."""
        if topic not in self.app_topics:
            await ensure_topics(self.kafka_bootstrap, {topic: 1})
            await self.producer.client.add_topic(topic)  # (see start(): tracked before the fan-out writes to it)
            self.app_topics.add(topic)

    async def prepare_shared(self, conn: Connection, shared_text: str) -> None:
        """Before a shared subscription is saved: its filter's topic exists, and a group nobody is subscribed to
        yet starts at the topic's end (once saved, the fan-out writes the filter's messages after it)."""
        shared = parse_shared(shared_text)
        await self.ensure_app_topic(shared_topic(shared.topic_filter))
        records = await self.store.all_subscriptions()
        if not any(shared_text in record.get("shared", {}) for record in records.values()):
            await start_group_at_end(self.kafka_bootstrap, self.store, shared)

    def join_shared(self, conn: Connection, shared_text: str, qos: int) -> None:
        group = self.shared_groups.get(shared_text)
        if group is None:
            group = self.shared_groups[shared_text] = SharedGroup(self, parse_shared(shared_text))
        group.join(conn, qos)

    def leave_shared(self, conn: Connection, shared_text: str) -> None:
        group = self.shared_groups.get(shared_text)
        if group is not None:
            group.leave(conn)

    def shared_ack(self, conn: Connection, pid: int, entry: tuple[str, str]) -> None:
        offset, shared_text = ack_entry(entry)
        group = self.shared_groups.get(shared_text)
        if group is not None:
            group.on_ack(conn, pid, offset)
        else:
            conn._flow_ended(pid)

    async def open_session(self, conn: Connection, clean_start: bool) -> bool:
        """Take the session over (from this or another node), apply clean start / expiry; returns
        whether a persistent session is resumed (CONNACK session present)."""
        store = self.store
        client = conn.client_id
        old = self.connections.get(client)
        if old is not None and old is not conn:
            old.taken_over = True
            await old.close(codec.RC_SESSION_TAKEN_OVER)
        self.connections[client] = conn
        session = await store.get_session(client)
        if session.get("conn") and session.get("node") not in (None, self.node_id):
            old_node = session["node"]
            if old_node not in self.peers.addresses:
                # a node registered after our last heartbeat: without its address the kick would be
                # dropped and the old connection would stay open (seen under load right after start-up)
                peer = await store.node_peer(old_node)
                if peer:
                    self.peers.addresses = {**self.peers.addresses, old_node: peer}
            self.peers.post(old_node, {"t": "kick", "c": client, "conn": session["conn"]})
        expired = False
        if session.get("disconnected_at") and session.get("expiry"):
            expired = int(session["disconnected_at"]) + int(session["expiry"]) * 1000 <= time.time() * 1000
        # a session of the other client type is not resumed: its messages are kept elsewhere (Redis or the
        # client's APPLICATION topic)
        resumed = (bool(session) and session.get("persistent") == "1" and not expired and not clean_start
                   and conn.persistent and session.get("type", "DEVICE") == conn.client_type)
        subscription = await store.get_subscription(client) if resumed else None
        conn.filters = dict(subscription["filters"]) if subscription else {}
        conn.no_local = set(subscription.get("no_local", ())) if subscription else set()
        conn.sub_ids = dict(subscription.get("sub_ids", {})) if subscription else {}
        conn.rap = set(subscription.get("rap", ())) if subscription else set()
        conn.shared = dict(subscription.get("shared", {})) if subscription else {}
        if resumed:
            conn.inbound_qos2 = await store.inbound_qos2(client)
        # a resumed session keeps its id; a new one gets the connection's (messages of an older session still
        # in the pipeline carry the older id, and save.lua drops them)
        conn.session_gen = (session.get("gen") or conn.conn_id) if resumed else conn.conn_id
        # Order matters if this node dies mid-CONNECT: listed in the node's client set first (so a dead
        # node's sessions are released), the record replaced in one step (never missing; a new session
        # discards the old one's queue in that same step), the pending expiry cancelled last (a session left
        # disconnected must keep its expiry).  Without a record and without clean start there is no old state
        # to discard (save.lua stores nothing for a session that has no record), and a preset
        # last_packet_id (harness/snapshot.py, the wrap scenarios) must survive.
        await store.add_node_client(self.node_id, client)
        await store.put_session(client, {
            "node": self.node_id, "conn": conn.conn_id, "persistent": int(conn.persistent),
            "expiry": conn.session_expiry or "", "protocol": conn.version, "connected_at": int(time.time() * 1000),
            "gen": conn.session_gen, "type": conn.client_type}, discard=not resumed and (bool(session) or clean_start)
            and not self.config.has("discarded_queue_kept"))  # defect: the old queue outlives its session
        await store.cancel_expiry(client)
        # the Will record an older connection of the client left (before this one stores its own): that network
        # connection ended without DISCONNECT, on a node that died and has not been released yet, or is being
        # taken over now (whose own end may take the record first: whoever takes it decides, once)
        await self._claim_older_will(client, conn.conn_id, resumed)
        # a delayed Will of this session's last connection: cancelled when the session resumes before the delay
        # ran out, published now when a clean start ends that session, or when the delay ran out before this
        # CONNECT and no sweep has published it yet ([MQTT-3.1.3-9]: only a connection made before the delay has
        # passed cancels it)
        due_ms = await store.pending_will_due_ms(client)
        pending_will = await store.take_pending_will(client)
        if pending_will is not None and not resumed:
            self._spawn(self.publish_will(client, pending_will, "its session ended at a new CONNECT"))
        elif pending_will is not None and due_ms is not None and due_ms <= int(time.time() * 1000):
            self._spawn(self.publish_will(client, pending_will, "its Will Delay Interval ran out before the session "
                                                                "resumed"))
        if not resumed:
            await store.put_subscription(client, None)  # the old session's subscriptions end with it
        if subscription is not None:
            await self.save_subscriptions(conn)  # the node holding the connection changed
        return resumed

    async def _claim_older_will(self, client: str, conn_id: str, resumed: bool) -> None:
        """Take the connected-Will record of another connection of ``client`` than ``conn_id`` and decide about
        its Will: without a Will Delay (every MQTT 3.1.1 Will) published now; with one cancelled when the
        session resumes, published now when it does not -- that session ended ([MQTT-3.1.3-9])."""
        found = await self.store.claim_other_connected_will(client, conn_id)
        if found is None:
            return
        will, delay = found
        if delay and resumed:
            log.info("%s: the Will of its previous connection is cancelled: the session resumed within its Will "
                     "Delay Interval", client)
            return
        self._spawn(self.publish_will(client, will, "its previous connection ended without DISCONNECT"))

    async def save_subscriptions(self, conn: Connection) -> None:
        record = None
        if conn.filters or conn.shared:
            record = {"node": self.node_id, "persistent": conn.persistent, "filters": conn.filters,
                      "gen": conn.session_gen}
            if conn.client_type == APPLICATION and conn.persistent:
                record["app"] = True  # the fan-out writes its QoS > 0 messages to the client's APPLICATION topic
            if conn.no_local:
                record["no_local"] = sorted(conn.no_local & set(conn.filters))
            if conn.sub_ids:  # MQTT 5 subscription options the fan-out applies (kafka_path.subscription_options)
                record["sub_ids"] = {f: i for f, i in sorted(conn.sub_ids.items()) if f in conn.filters}
            if conn.rap:
                record["rap"] = sorted(conn.rap & set(conn.filters))
            if conn.shared:  # the fan-out writes each matching filter's messages once to its shared topic
                record["shared"] = dict(sorted(conn.shared.items()))
        await self.store.put_subscription(conn.client_id, record)

    async def connection_lost(self, conn: Connection) -> None:
        client = conn.client_id
        if self.connections.get(client) is conn:
            del self.connections[client]
        will, conn.will = conn.will, None  # once (stop() and the connection's own end both get here)
        if conn.will_stored:
            conn.will_stored = False
            # The Will is this connection's to publish only while it can take its record: the client's next
            # CONNECT (open_session) or the release of this node's sessions (it was declared dead while paused)
            # may have taken it and decided already.  A taken-over connection leaves a delayed Will's record to
            # the new CONNECT, which knows whether the session resumed ([MQTT-3.1.3-9]).
            if not (conn.taken_over and will is not None and conn.will_delay):
                try:
                    if await self.store.take_connected_will(client, conn.conn_id) is None:
                        will = None
                except Exception as error:
                    # not knowing whether another node took it: published (twice at worst), never lost
                    log.warning("%s: could not take its Will record: %r", client, error)
        try:
            await self.store.remove_node_client(self.node_id, client)
        except Exception as error:
            log.warning("%s: could not update the node's client set: %r", client, error)
        if conn.taken_over:
            # a Will without delay is published (the old network connection closed without DISCONNECT); a
            # delayed one is the new CONNECT's to cancel or publish (its record left above: open_session), or,
            # when it could not be stored, treated as a resumed session's: not published ([MQTT-3.1.3-9])
            if will is not None and not conn.will_delay:
                await self.publish_will(client, will, "its connection was taken over")
            return
        delay = self.will_delay_s(conn) if will is not None else 0
        if will is not None and delay == 0:
            await self.publish_will(client, will, "its connection closed without DISCONNECT")
            will = None
        elif will is not None:
            try:
                await self.store.put_pending_will(client, will, int(time.time() * 1000) + delay * 1000)
            except Exception as error:
                log.warning("%s: could not keep the delayed Will; publishing it now: %r", client, error)
                await self.publish_will(client, will, "its delayed Will could not be stored")
                will = None
        try:
            if conn.persistent and conn.session_expiry == 0:
                # MQTT 5 DISCONNECT with Session Expiry Interval 0: the session ends with the connection
                if await self.store.end_session_if_owned(client, conn.conn_id) and client not in self.connections:
                    await self.store.put_subscription(client, None)
            elif conn.persistent:
                expires_at = None
                if conn.session_expiry is not None:
                    expires_at = int(time.time() * 1000) + conn.session_expiry * 1000
                owned = await self.store.mark_disconnected(client, conn.conn_id, expires_at, conn.session_expiry)
                if will is not None and not owned:
                    await self._pending_will_of_a_taken_session(client, conn.session_gen)
            elif await self.store.delete_session_if_owned(client, conn.conn_id) and client not in self.connections:
                # (a newer connection of the client on this node handles the subscription itself)
                await self.store.put_subscription(client, None)
        except Exception as error:
            log.warning("%s: could not record the disconnect: %r", client, error)

    async def _pending_will_of_a_taken_session(self, client: str, gen: str) -> None:
        """A delayed Will was just kept pending for session ``gen``, which a newer connection took meanwhile (its
        CONNECT may have looked for a pending Will before this one was stored): cancelled if that connection
        resumed the session, published now if the session ended ([MQTT-3.1.3-9])."""
        will = await self.store.take_pending_will(client)
        if will is None:
            return  # that CONNECT (or a sweep) took it
        if (await self.store.get_session(client)).get("gen") == gen:
            log.info("%s: its delayed Will is cancelled: the session resumed on a new connection", client)
            return
        await self.publish_will(client, will, "its session ended at a new CONNECT")

    @staticmethod
    def will_delay_s(conn: Connection) -> int:
        """Seconds until the Will of a connection that just ended is due (see due_in_s)."""
        return due_in_s(conn.will_delay, conn.persistent, conn.session_expiry)

    async def publish_will(self, client: str, message: dict[str, Any], why: str) -> None:
        """A Will goes the way of a PUBLISH: the incoming topic (fan-out to every node's subscribers, the
        persistent sessions' queues), retained when Will Retain is 1."""
        for attempt in range(1, 4):
            try:
                await (await self.produce_incoming(message))
                break
            except Exception as error:
                log.warning("%s: publishing its Will failed (attempt %d): %r", client, attempt, error)
                await asyncio.sleep(0.5)
        else:
            log.error("%s: Will on %r not published after 3 attempts", client, message["topic"])
            return
        if message.get("retain"):
            await self.retain(message)
        self.stats["wills_published"] += 1
        log.info("%s: Will published on %r (%s)", client, message["topic"], why)

    async def retain(self, message: dict[str, Any]) -> None:
        """Store (or, empty, delete) the topic's retained message; Redis replicates it, so a node kill keeps it."""
        for attempt in range(1, 4):
            try:
                await self.store.put_retained(message)
                return
            except Exception as error:
                log.warning("retained message on %r not stored (attempt %d): %r", message["topic"], attempt, error)
                await asyncio.sleep(0.5)
        log.error("retained message on %r not stored after 3 attempts (delivered, not retained)", message["topic"])

    def retain_after(self, produced: asyncio.Future, message: dict[str, Any]) -> asyncio.Future:
        """Store ``message`` as its topic's retained message once ``produced`` (its Kafka write) succeeds; one
        worker per node applies them in the order they were published.  Returns when it is done."""
        done = asyncio.get_running_loop().create_future()
        self.retain_queue.put_nowait((produced, message, done))
        if self.retain_worker is None or self.retain_worker.done():
            self.retain_worker = asyncio.get_running_loop().create_task(self._retain_worker())
        return done

    async def _retain_worker(self) -> None:
        while not self.retain_queue.empty():
            produced, message, done = self.retain_queue.get_nowait()
            # wait() does not raise: a produce that failed or was cancelled is not retained (the publisher got
            # an error, or nothing), and this worker goes on with the next one
            await asyncio.wait([produced])
            if produced.cancelled() or produced.exception() is not None:
                done.set_result(False)
                continue
            await self.retain(message)
            if not done.done():
                done.set_result(True)

    def _spawn(self, coroutine) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self.tasks.append(task)
        task.add_done_callback(lambda t: t in self.tasks and self.tasks.remove(t))

    async def release_dead_node_sessions(self, node: str) -> None:
        """Another node died with clients connected: mark their sessions disconnected now, so that MQTT 5
        session expiry starts (those clients can reconnect anywhere meanwhile)."""
        released = 0
        for client in await self.store.take_node_clients(node):
            session = await self.store.get_session(client)
            if session.get("node") != node or not session.get("conn"):
                continue
            expires_at = None
            if session.get("persistent") == "1" and session.get("expiry"):
                expires_at = int(time.time() * 1000) + int(session["expiry"]) * 1000
            if session.get("persistent") == "1":
                await self.store.mark_disconnected(client, session["conn"], expires_at)
            else:
                await self.store.put_subscription(client, None)
                await self.store.delete_session(client)
            released += 1
            await self._dead_connection_will(client, session)
        log.info("node %s is dead: released %d of its sessions", node, released)

    async def _dead_connection_will(self, client: str, session: dict[str, str]) -> None:
        """The Will of a connection that was open on a dead node: its network connection is gone without a
        DISCONNECT, so it is published (or, delayed, kept pending), counted from now.  (A client that reconnected
        before the release has had it claimed by its CONNECT: open_session.)"""
        try:
            found = await self.store.take_connected_will(client, session["conn"])
        except Exception as error:
            log.warning("%s: its Will record could not be read: %r", client, error)
            return
        if found is None:
            return
        will, delay = found
        expiry = int(session["expiry"]) if session.get("expiry") else None
        due = due_in_s(delay, session.get("persistent") == "1", expiry)
        if due == 0:
            await self.publish_will(client, will, "its node died")
            return
        await self.store.put_pending_will(client, will, int(time.time() * 1000) + due * 1000)
        if (await self.store.get_session(client)).get("conn") not in ("", session["conn"]):
            # the client reconnected between this release's read of its session and now
            await self._pending_will_of_a_taken_session(client, session.get("gen", ""))

    async def reassert_sessions(self) -> None:
        """This node was declared dead (paused too long) but still holds connections: own them again."""
        for client, conn in list(self.connections.items()):
            if conn.closed or not conn.connected.is_set():
                continue
            session = await self.store.get_session(client)
            if session.get("node") == self.node_id and session.get("conn") in ("", conn.conn_id):
                await self.store.redis.hset(self.store.session_key(client), mapping={
                    "conn": conn.conn_id, "disconnected_at": ""})
                await self.store.cancel_expiry(client)
                await self.store.add_node_client(self.node_id, client)
                if conn.filters or conn.shared:
                    await self.save_subscriptions(conn)
        log.info("node %s re-registered after being declared dead; sessions reasserted", self.node_id)

    async def expiry_sweeper(self) -> None:
        while True:
            await asyncio.sleep(self.config.session_expiry_check_s)
            try:
                for client in await self.store.due_expiries(int(time.time() * 1000)):
                    if not await self.store.claim_expiry(client):
                        continue  # another node took it
                    # record and state in one step, only while still disconnected (conn = ''): a client that
                    # reconnected meanwhile keeps its session
                    if not await self.store.end_session_if_owned(client, ""):
                        continue
                    await self.store.put_subscription(client, None)
                    self.stats["sessions_expired"] += 1
                for client in await self.store.due_wills(int(time.time() * 1000)):
                    will = await self.store.take_pending_will(client)  # None: another node claimed it
                    if will is not None:
                        await self.publish_will(client, will, "its Will Delay Interval ran out")
            except Exception as error:
                log.warning("session expiry sweep failed: %r", error)

    # ------------------------------------------------------------ message flow
    async def produce_incoming(self, message: dict[str, Any]) -> asyncio.Future:
        return await self.producer.send(self.config.incoming_topic, orjson.dumps(message),
                                        key=message["topic"].encode())

    async def route_live(self, client: str, node: str | None, message: dict[str, Any]) -> None:
        if node == self.node_id or node is None:
            self._deliver_live(client, message)
            return
        self.peers.post(node, {"t": "live", "c": client, "m": message})

    def _deliver_live(self, client: str, message: dict[str, Any]) -> None:
        conn = self.connections.get(client)
        if conn is None or not conn.connected.is_set():
            return
        if message.get("gen") not in (None, conn.session_gen):
            return  # routed by a subscription of an earlier session of this client ([MQTT-3.1.2-4])
        conn.deliver_live(message)

    async def hint(self, client: str) -> None:
        conn = self.connections.get(client)
        if conn is not None:
            conn.wake.set()
            return
        subscription_node = await self._owner_node(client)
        if subscription_node and subscription_node != self.node_id:
            self.peers.post(subscription_node, {"t": "hint", "c": client})

    async def _owner_node(self, client: str) -> str | None:
        session = await self.store.get_session(client)
        return session.get("node") if session.get("conn") else None

    def on_peer_message(self, message: dict[str, Any]) -> None:
        kind, client = message.get("t"), message.get("c")
        conn = self.connections.get(client)
        if conn is None:
            return
        if kind == "hint":
            conn.wake.set()
        elif kind == "live":
            self._deliver_live(client, message["m"])
        elif kind == "kick" and conn.conn_id == message.get("conn"):
            conn.taken_over = True
            asyncio.get_running_loop().create_task(conn.close(codec.RC_SESSION_TAKEN_OVER))


def due_in_s(will_delay: int, persistent: bool, session_expiry: int | None) -> int:
    """Seconds until a Will is due once its connection ended: the Will Delay Interval, or the session's end if that
    comes first ([MQTT-3.1.3-9]); 0 = now, also for every clean session (it ends with the connection).
    ``session_expiry``: None = the session never expires."""
    if not will_delay or not persistent or session_expiry == 0:
        return 0
    if session_expiry is None:
        return will_delay
    return min(will_delay, session_expiry)
