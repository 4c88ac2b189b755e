"""The executor: plays a plan in real time against a target's MQTT endpoints and records what happens.

Everything runs on the calling thread: one loop that alternates between "run every plan event that is
due" and "wait on the selector until the next event is due" (harness/clients.py says why not a thread per
client).  If the loop falls behind, events run late and the history shows their real times.

Phases (each recorded as a ``phase`` row by harness/run.py around these calls):
- ``connect_all()``: every publisher connects, every subscriber's offset-0 connect runs; waits until all
  are connected and subscribed, so the workload starts with every subscription in place.
- ``play()``: the plan's publishes and subscriber actions at their offsets (offset 0 = workload start).
- ``settle()``: waits for the outstanding publish acknowledgements; what is left becomes indeterminate.
- ``drain()``: every persistent subscriber reconnects (clean_start = 0) and the loop runs until
  harness/drain.py's rule ends it: quiet for quiet_s with no acknowledged delivery still owed, quiet for
  the longer outstanding quiet while some are owed (reason "quiet" for both, ``ended_by`` says which), or
  timeout_s (reason "timeout").

Client faults (``client_flap``, ``client_reconnect_storm``, faults/client.py) are scheduled by the nemesis
but played here: ``client_fault_player()`` is the nemesis' ``client_player`` hook.  The nemesis thread
hands each (fault, stage) to this loop through a queue and waits for the evidence; the loop thread does
the socket work (paho is not thread-safe) and answers once the sockets really closed (apply) or the
reconnect's CONNACK arrived (heal).  A fault that cannot be applied raises FaultNotApplicable back to the
nemesis, which records a fault_error row: the run is then unknown, never silently short of a fault.

Every CONNECT carries the credentials ``[target.credentials]`` gives its client id.  A broker that refuses
them (CONNACK 3.1.1 4 / 5, MQTT 5 0x86 / 0x87 / 0x8C) ends the run in whatever phase: the loop raises
CredentialsRefused naming the client and the code in words, and the run is unknown.
"""

from __future__ import annotations

import queue
import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

from contracts.credentials import Credentials
from harness.clients import ClientSession, Counters, SelectorLoop
from harness.drain import OUTSTANDING_QUIET, QUIET, DrainRule, OutstandingDeliveries, drain_decision
from harness.history import HistoryRecorder
from harness.tls import ClientTls
from properties.plan import CONNECT, Plan, PublishPlan, SubscriberAction

Endpoint = tuple[str, int, str]  # host, port, node name
T = TypeVar("T")


class ExecutorError(RuntimeError):
    """The executor cannot go on (e.g. no client could connect at all)."""


class CredentialsRefused(ExecutorError):
    """The broker refused a client's credentials (CONNACK 3.1.1 4 / 5, MQTT 5 0x86 / 0x87 / 0x8C): the run
    cannot test what it planned, so it ends unknown with the refusal named (harness/connack.py)."""


@dataclass(frozen=True)
class ExecutorSettings:
    keepalive_s: int = 30
    connect_timeout_s: float = 5.0
    ready_timeout_s: float = 20.0  # connect_all: every client connected and subscribed
    publish_timeout_s: float = 15.0  # no ack by then -> indeterminate
    settle_timeout_s: float = 15.0
    reconnect_backoff_s: float = 0.5
    housekeeping_s: float = 0.25
    max_wait_s: float = 0.1  # longest single selector wait (keeps stop requests responsive)
    # Source address of every client connection; network faults match client packets on it
    # (faults/selectors.py client_hosts: with distinct node addresses 127.0.0.1 is the clients').
    client_bind_address: str = ""
    client_fault_timeout_s: float = 10.0  # sockets closed / reconnect CONNACK within this, else no evidence


class Executor:
    def __init__(self, plan: Plan, endpoints: Sequence[Endpoint], recorder: HistoryRecorder, *,
                 settings: ExecutorSettings | None = None, stop: threading.Event | None = None,
                 before_reconnect: Callable[[str, str], None] | None = None,
                 before_disconnect: Callable[[str], None] | None = None,
                 credentials: Credentials | None = None, tls: ClientTls | None = None):
        if not endpoints:
            raise ExecutorError("the target exposes no MQTT endpoint")
        self.plan = plan
        self.endpoints = list(endpoints)
        self.recorder = recorder
        self.settings = settings or ExecutorSettings()
        self.stop = stop or threading.Event()
        # White box: called with (client id, why) just before a persistent session resumes (the queue is
        # then at its largest; harness/snapshot.QueueSizeProbe records its size).
        self.before_reconnect = before_reconnect
        # White box: called with the client id shortly before each planned disconnect of a persistent
        # subscriber (preset_starts: the reference target presets the session's last packet id there, for
        # preset_each_offline).
        self.before_disconnect = before_disconnect
        self.loop = SelectorLoop()
        self.counters = Counters()
        self.max_lag_s = 0.0
        self.workload_started: float | None = None
        publisher_names = plan.publisher_ids()
        self.sessions: dict[str, ClientSession] = {
            c.client_id: ClientSession(
                plan=c, recorder=recorder, loop=self.loop, counters=self.counters, address_of=self._address,
                publisher_names=publisher_names, keepalive_s=self.settings.keepalive_s,
                connect_timeout_s=self.settings.connect_timeout_s, bind_address=self.settings.client_bind_address,
                node=c.node, credential=credentials.for_client(c.client_id) if credentials else None, tls=tls)
            for c in plan.clients}
        # The first refusal of a client's credentials: the loop raises CredentialsRefused with it (once).
        self.refusal: str | None = None
        self._refusal_raised = False
        self.outstanding = OutstandingDeliveries(member_of={
            c.client_id: frozenset(s.topic_filter for s in c.subscriptions if s.topic_filter.startswith("$share/"))
            for c in plan.clients if any(s.topic_filter.startswith("$share/") for s in c.subscriptions)})
        for session in self.sessions.values():
            session.on_acked = self._expect_deliveries
            session.on_delivered = self.outstanding.delivered
            session.on_fresh_session = self.outstanding.forget
            session.on_refused = self._refused
        self._last_housekeeping = 0.0
        self._fault_requests: queue.Queue[tuple[Any, str, Future]] = queue.Queue()
        self._fault_waiters: list[_Waiter] = []
        # Client faults whose client is reconnecting (lost its connection, e.g. to a killed broker node)
        # at the fault's start: (spec, params, sessions, future, deadline), started once it is back.
        self._deferred_drops: list[tuple[Any, dict[str, Any], list[ClientSession], Future, float]] = []
        self._held_by_fault: dict[str, str] = {}  # client id -> the client fault holding it offline

    def _expect_deliveries(self, publish: PublishPlan) -> None:
        """An acknowledged publish is owed to every persistent subscriber subscribed right now -- but one with
        message expiry 0 is owed to nobody (expired on arrival; expiry-zero seed 1: 87 such kept the drain
        waiting for its longer outstanding quiet)."""
        if publish.expiry_s == 0:
            return
        listening = [(s.client_id, [(sub.topic_filter, sub.qos) for sub in s.plan.subscriptions])
                     for s in self.sessions.values() if s.session_persistent and s.subscribed and not s.is_publisher]
        self.outstanding.acknowledged(publish.publisher, publish.seq, publish.topic, publish.qos, listening)

    def _refused(self, message: str) -> None:
        if self.refusal is None:
            self.refusal = message

    def _address(self, node: int) -> Endpoint:
        return self.endpoints[node % len(self.endpoints)]

    @property
    def publishers(self) -> list[ClientSession]:
        return [s for s in self.sessions.values() if s.is_publisher]

    @property
    def subscribers(self) -> list[ClientSession]:
        return [s for s in self.sessions.values() if not s.is_publisher]

    # -- the loop ----------------------------------------------------------------------------------
    def _pump(self, until: float) -> None:
        """Run socket I/O, reconnect timers and housekeeping until the monotonic time ``until``."""
        while not self.stop.is_set():
            now = time.monotonic()
            if now >= until:
                return
            self.loop.poll(min(until - now, self.settings.max_wait_s))
            if self.refusal is not None and not self._refusal_raised:
                self._refusal_raised = True  # once: the teardown's own loop turns go on
                raise CredentialsRefused(self.refusal)
            self._serve_client_faults()
            self._housekeeping()

    def _housekeeping(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_housekeeping < self.settings.housekeeping_s:
            return
        self._last_housekeeping = now
        for session in self.sessions.values():
            session.misc()
            session.check_connect_timeout(now)
            session.expire_pending(now, self.settings.publish_timeout_s)
            # A client the plan wants connected but which lost (or never got) its connection retries.
            if session.want_connected and session.paho is None:
                if session.reconnect_at is None:
                    session.reconnect_at = now + self.settings.reconnect_backoff_s
                elif now >= session.reconnect_at:
                    self._reconnect(session, "auto-reconnect after a lost or failed connection")

    def _reconnect(self, session: ClientSession, why: str) -> None:
        # After a failed attempt, try the next broker node (a killed node must not hold its clients back).
        node = (session.node + 1) % len(self.endpoints) if session.consecutive_failures else session.node
        session.connect(clean_start=False if session.plan.persistent else True, node=node,
                        session_expiry_s=session.plan.session_expiry_s, why=why)

    def _wait_for(self, condition: Callable[[], bool], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if self.stop.is_set() or time.monotonic() >= deadline:
                return condition()
            self._pump(min(deadline, time.monotonic() + self.settings.max_wait_s))
        return True

    # -- phases ------------------------------------------------------------------------------------
    def connect_all(self) -> dict[str, list[str]]:
        """Connect every publisher and run the subscribers' offset-0 connects; wait until they are up.
        Returns {"not_ready": [...client ids]} (empty when every client is connected and subscribed)."""
        for session in self.publishers:
            session.connect(clean_start=True, node=session.plan.node, session_expiry_s=None, why="start")
        for action in self.plan.subscriber_actions:
            if action.offset_s == 0.0 and action.action == CONNECT:
                self._subscriber_action(action, why="plan (offset 0, before the workload)")
        ready = self._wait_for(lambda: all(s.subscribed for s in self.sessions.values() if s.want_connected),
                               self.settings.ready_timeout_s)
        not_ready = [] if ready else sorted(
            s.client_id for s in self.sessions.values() if s.want_connected and not s.subscribed)
        if not_ready and len(not_ready) == len(self.sessions):
            raise ExecutorError(f"no client could connect to {[f'{h}:{p}' for h, p, _ in self.endpoints]} "
                                f"within {self.settings.ready_timeout_s} s")
        return {"not_ready": not_ready}

    def play(self, on_tick: Callable[[float], None] | None = None,
             on_start: Callable[[float], None] | None = None) -> None:
        """Play every publish and subscriber action at its offset from now (offset-0 connects are done).
        ``on_start(t0)`` gets the monotonic time of offset 0 (the nemesis counts its offsets from it)."""
        events: list[tuple[float, int, object]] = [(p.offset_s, 1, p) for p in self.plan.publishes]
        events += [(a.offset_s, 0, a) for a in self.plan.subscriber_actions
                   if not (a.offset_s == 0.0 and a.action == CONNECT)]
        events += [(t, 0, WithholdAcks(client)) for t, client in withhold_starts(self.plan.subscriber_actions)]
        if self.before_disconnect is not None:
            persistent = {c.client_id for c in self.plan.subscribers() if c.persistent}
            events += [(t, 0, BeforeDisconnect(client)) for t, client in preset_starts(self.plan.subscriber_actions)
                       if client in persistent]
        events.sort(key=lambda e: (e[0], e[1]))  # stable: plan order within one offset
        self.workload_started = start = time.monotonic()
        if on_start is not None:
            on_start(start)
        index = 0
        while index < len(events) and not self.stop.is_set():
            now = time.monotonic()
            offset = now - start
            # Run everything that is due; a late loop catches up here (lag is measured, not hidden).
            while index < len(events) and events[index][0] <= offset:
                due, _, event = events[index]
                self.max_lag_s = max(self.max_lag_s, offset - due)
                if isinstance(event, PublishPlan):
                    self.sessions[event.publisher].publish(event)
                elif isinstance(event, WithholdAcks):
                    self.sessions[event.client_id].withhold_acks()
                elif isinstance(event, BeforeDisconnect):
                    self.before_disconnect(event.client_id)
                else:
                    self._subscriber_action(event, why="plan")
                index += 1
            if on_tick is not None:
                on_tick(offset)
            next_due = start + events[index][0] if index < len(events) else start + self.plan.duration_s
            self._pump(min(next_due, time.monotonic() + self.settings.max_wait_s))
        end = start + self.plan.duration_s
        while not self.stop.is_set() and time.monotonic() < end:  # the plan's tail without events
            if on_tick is not None:
                on_tick(time.monotonic() - start)
            self._pump(min(end, time.monotonic() + 0.2))

    def _subscriber_action(self, action: SubscriberAction, *, why: str) -> None:
        session = self.sessions[action.client_id]
        self._held_by_fault.pop(action.client_id, None)  # the plan takes the client back from a fault
        if action.action == CONNECT:
            self._probe_before_resume(session, why)
            session.connect(clean_start=action.clean_start, node=action.node,
                            session_expiry_s=action.session_expiry_s, why=why)
        else:
            session.disconnect(abrupt=action.abrupt, why=why)

    def _probe_before_resume(self, session: ClientSession, why: str) -> None:
        if self.before_reconnect is not None and session.plan.persistent and session.paho is None:
            self.before_reconnect(session.client_id, why)

    def settle(self) -> dict[str, int]:
        """Wait for outstanding publish outcomes; the rest become indeterminate.  Publishers then leave."""
        for session in self.publishers:
            session.want_connected = False
        self._wait_for(lambda: not any(s.pending for s in self.publishers), self.settings.settle_timeout_s)
        left = sum(len(s.pending) for s in self.publishers)
        for session in self.publishers:
            session.settle_all(f"still unacknowledged {self.settings.settle_timeout_s} s after the workload")
            session.disconnect(abrupt=False, why="workload finished")
        self._pump(time.monotonic() + 0.2)  # let the DISCONNECT packets go out
        return {"unacknowledged_after_settle": left}

    def drain(self, quiet_s: float, timeout_s: float) -> dict[str, object]:
        """Reconnect every persistent subscriber and wait for quiet.  Returns the drain_end details."""
        started = time.monotonic()
        deadline = started + timeout_s
        subscribers = [s for s in self.subscribers if s.plan.persistent]
        # Connected subscribers leave cleanly first, so the reconnect is not a session takeover.
        for session in subscribers:
            if session.paho is not None:
                session.disconnect(abrupt=False, why="drain: reconnect every persistent subscriber")
        self._wait_for(lambda: all(s.paho is None for s in subscribers) and not self._writing(),
                       min(2.0, timeout_s))
        for session in subscribers:
            self._probe_before_resume(session, "drain")
            session.connect(clean_start=False, node=session.node, session_expiry_s=session.plan.session_expiry_s,
                            why="drain")
        # Wait by harness/drain.py's rule: quiet for quiet_s with nothing owed, or for the longer
        # outstanding quiet while acknowledged messages are still owed (the pipeline may lag), or timeout.
        rule = DrainRule(quiet_s, max(timeout_s, quiet_s))
        ended_by = "stopped"
        while not self.stop.is_set():
            now = time.monotonic()
            decision = drain_decision(
                rule, elapsed_s=now - started, quiet_for_s=now - max(self.counters.last_delivery_mono, started),
                all_up=all(s.subscribed for s in subscribers), outstanding=self.outstanding.count)
            if decision is not None:
                ended_by = decision
                break
            self._pump(min(deadline, now + self.settings.max_wait_s))
        reason = "quiet" if ended_by in (QUIET, OUTSTANDING_QUIET) else ended_by  # the checkers' contract
        not_connected = sorted(s.client_id for s in subscribers if not s.subscribed)
        return {"reason": reason, "ended_by": ended_by, "elapsed_s": round(time.monotonic() - started, 3),
                "outstanding": self.outstanding.count, "outstanding_quiet_s": rule.outstanding_quiet_s,
                "subscribers_not_connected": not_connected}

    def _writing(self) -> bool:
        return False

    def run_alongside(self, work: Callable[[], T]) -> T:
        """Run ``work`` in a helper thread while this loop keeps serving sockets and client faults (the
        nemesis' heal_all may heal a client fault, which this loop must play).  Returns its result."""
        result: dict[str, Any] = {}

        def target() -> None:
            try:
                result["value"] = work()
            except BaseException as error:  # noqa: BLE001 - re-raised on the loop thread
                result["error"] = error

        helper = threading.Thread(target=target, name="executor-alongside", daemon=True)
        helper.start()
        while helper.is_alive():
            self._pump(time.monotonic() + self.settings.max_wait_s)
            if self.stop.is_set():
                helper.join(0.1)
        helper.join()
        if "error" in result:
            raise result["error"]
        return result["value"]

    # -- client faults -----------------------------------------------------------------------------
    def client_node(self, client_id: str) -> str | None:
        """The node of the client's current (or last) connection, or None before its first connect."""
        session = self.sessions.get(client_id)
        return session.node_name or None if session is not None else None

    def client_fault_player(self) -> Callable[[Any, str], Any]:
        """The nemesis' ``client_player(spec, stage) -> Evidence``; blocks its (nemesis) thread until this
        loop has played the stage.  Raises what the loop raised (FaultNotApplicable, TimeoutError)."""
        def play(spec: Any, stage: str) -> Any:
            future: Future = Future()
            self._fault_requests.put((spec, stage, future))
            return future.result(timeout=self.settings.client_fault_timeout_s + 10.0)
        return play

    def _serve_client_faults(self) -> None:
        while True:
            try:
                spec, stage, future = self._fault_requests.get_nowait()
            except queue.Empty:
                break
            if not future.set_running_or_notify_cancel():
                continue
            try:
                self._start_client_fault(spec, stage, future)
            except BaseException as error:  # noqa: BLE001 - handed to the nemesis, which records it
                future.set_exception(error)
        now = time.monotonic()
        for deferred in list(self._deferred_drops):
            spec, params, sessions, future, deadline = deferred
            if all(s.connected for s in sessions) or now >= deadline:
                self._deferred_drops.remove(deferred)
                try:
                    self._drop_sessions(spec, params, sessions, future, may_defer=False)
                except BaseException as error:  # noqa: BLE001 - handed to the nemesis
                    future.set_exception(error)
        for waiter in list(self._fault_waiters):
            # Why poll: a socket closes / a CONNACK arrives on a later loop turn; answer when it did, or
            # with the evidence as it stands at the deadline (bit false: the fault did not take).
            if waiter.done() or now >= waiter.deadline:
                self._fault_waiters.remove(waiter)
                try:
                    waiter.future.set_result(waiter.evidence())
                except BaseException as error:  # noqa: BLE001 - handed to the nemesis
                    waiter.future.set_exception(error)

    def _start_client_fault(self, spec: Any, stage: str, future: Future) -> None:
        from faults.base import FaultNotApplicable

        rng = random.Random(f"{self.plan.seed}:{spec.id}")  # = FaultContext.rng_for: same seed, same choice
        params = dict(spec.params)
        if spec.kind == "client_flap":
            session = self.sessions.get(spec.target)
            if session is None:
                raise FaultNotApplicable(f"client_flap target {spec.target!r} is not a client of this plan")
            sessions = [session]
        elif spec.kind == "client_reconnect_storm":
            from faults.client import storm_sessions

            if stage == "apply":
                connected = [s.client_id for s in self.subscribers if s.connected]
                sessions = [self.sessions[c] for c in storm_sessions(params, connected, rng)]
            else:
                sessions = [s for s in self.sessions.values() if self._held_by_fault.get(s.client_id) == spec.id]
        else:
            raise FaultNotApplicable(f"fault kind {spec.kind!r} is not a client fault the executor plays")
        if stage == "apply":
            self._drop_sessions(spec, params, sessions, future)
        else:
            self._reconnect_sessions(spec, params, sessions, rng, future)

    def _drop_sessions(self, spec: Any, params: dict[str, Any], sessions: list[ClientSession],
                       future: Future, may_defer: bool = True) -> None:
        from faults.base import Evidence, FaultNotApplicable
        from faults.client import socket_lost_check

        if not sessions:
            raise FaultNotApplicable(f"{spec.kind} {spec.id}: no subscriber is connected at its start")
        offline = [s for s in sessions if s.paho is None or not s.connected]
        # A client that lost its connection (a broker node was killed) and is reconnecting gets the fault
        # once it is back, within the client-fault timeout; one the plan holds offline never will.
        if offline and may_defer and all(s.want_connected for s in offline):
            self._deferred_drops.append(
                (spec, params, sessions, future, time.monotonic() + self.settings.client_fault_timeout_s))
            return
        if offline:
            waited = "" if may_defer else f" (nor {self.settings.client_fault_timeout_s:g} s later)"
            raise FaultNotApplicable(f"{spec.kind} {spec.id}: client(s) {', '.join(s.client_id for s in offline)} "
                                     f"not connected at the fault's start{waited}; there is no socket to drop")
        abrupt = params.get("mode", "abrupt") == "abrupt"
        watched = []
        for session in sessions:
            sock = session.paho.socket()
            local, remote = _socket_addresses(sock)
            watched.append((session, sock, local, remote, session.node_name))
            session.disconnect(abrupt=abrupt, why=f"fault {spec.id}: {spec.kind} ({params.get('mode')})",
                               fault_id=spec.id)
            self._held_by_fault[session.client_id] = spec.id

        def closed(sock: Any, local: str) -> bool:
            return sock is None or (sock.fileno() == -1 and not _tcp_established(local))

        def evidence() -> Evidence:
            return Evidence(tuple(
                socket_lost_check(session.client_id, closed(sock, local), mode=params.get("mode"), node=node,
                                  local=local, remote=remote, fd_closed=sock is None or sock.fileno() == -1,
                                  tcp_established=_tcp_established(local))
                for session, sock, local, remote, node in watched))

        self._fault_waiters.append(_Waiter(
            future, lambda: all(closed(sock, local) for _, sock, local, _, _ in watched), evidence,
            time.monotonic() + self.settings.client_fault_timeout_s))

    def _reconnect_sessions(self, spec: Any, params: dict[str, Any], sessions: list[ClientSession],
                            rng: random.Random, future: Future) -> None:
        from faults.base import Check, Evidence
        from faults.client import reconnect_node, reconnected_check

        held = [s for s in sessions if self._held_by_fault.get(s.client_id) == spec.id]
        if not params.get("reconnect", True) or not held:
            why = "the fault does not reconnect (reconnect = false)" if held else                 "the plan took the client(s) back before the fault's end"
            for session in held:
                self._held_by_fault.pop(session.client_id, None)
            future.set_result(Evidence.of(Check("client left to the plan", {
                "clients": [s.client_id for s in sessions], "why": why}, True)))
            return
        clean_start = bool(params.get("clean_start", False))
        for session in held:  # every connect in one loop turn: a storm is many sessions at once
            self._held_by_fault.pop(session.client_id, None)
            node = reconnect_node(params.get("node", "same"), session.node, len(self.endpoints), rng)
            session.connect(clean_start=clean_start or not session.plan.persistent, node=node,
                            session_expiry_s=session.plan.session_expiry_s,
                            why=f"fault {spec.id}: {spec.kind} reconnect", fault_id=spec.id)

        def evidence() -> Evidence:
            return Evidence(tuple(
                reconnected_check(s.client_id, s.connected and s.fault_id == spec.id, node=s.node_name,
                                  clean_start=s.clean_start, session_present=s.session_present)
                for s in held))

        self._fault_waiters.append(_Waiter(
            future, lambda: all(s.connected and s.fault_id == spec.id for s in held), evidence,
            time.monotonic() + self.settings.client_fault_timeout_s))

    def _fail_client_faults(self, reason: str) -> None:
        """The loop is going away: every waiting nemesis thread gets an error instead of a long timeout."""
        for _spec, _params, _sessions, future, _deadline in self._deferred_drops:
            if not future.done():
                future.set_exception(RuntimeError(reason))
        self._deferred_drops.clear()
        for waiter in self._fault_waiters:
            if not waiter.future.done():
                waiter.future.set_exception(RuntimeError(reason))
        self._fault_waiters.clear()
        while True:
            try:
                _, _, future = self._fault_requests.get_nowait()
            except queue.Empty:
                break
            if future.set_running_or_notify_cancel():
                future.set_exception(RuntimeError(reason))

    def close(self) -> None:
        """Disconnect everyone cleanly (recorded) and release the sockets."""
        closer = getattr(self.before_reconnect, "close", None)
        if closer is not None:
            closer()
        self._fail_client_faults("the executor closed before the client fault was played")
        for session in self.sessions.values():
            if session.paho is not None:
                session.disconnect(abrupt=False, why="run finished")
            session.settle_all("the run ended before the acknowledgement")
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline and self.loop.selector.get_map():
            self.loop.poll(0.05)
        for key in list(self.loop.selector.get_map().values()):
            try:
                key.fileobj.close()
            except OSError:
                pass
        self.loop.close()


@dataclass(frozen=True)
class WithholdAcks:
    """A plan-derived event: from now until its connection ends, this subscriber sends no PUBACK."""

    client_id: str


def withhold_starts(actions: Sequence[SubscriberAction]) -> list[tuple[float, str]]:
    """(offset, client) at which each subscriber starts withholding its PUBACKs: ``withhold_acks_s`` before
    each abrupt planned disconnect that asks for it (never before offset 0, never before the connect that
    precedes the disconnect: acks withheld on an earlier connection would owe nothing to this one)."""
    starts: list[tuple[float, str]] = []
    last_connect: dict[str, float] = {}
    for action in sorted(actions, key=lambda a: a.offset_s):
        if action.action == CONNECT:
            last_connect[action.client_id] = action.offset_s
        elif action.abrupt and action.withhold_acks_s > 0:
            start = max(action.offset_s - action.withhold_acks_s, last_connect.get(action.client_id, 0.0), 0.0)
            starts.append((round(start, 6), action.client_id))
    return starts


@dataclass(frozen=True)
class BeforeDisconnect:
    """A plan-derived event: the white-box hook's moment before this subscriber's planned disconnect."""

    client_id: str


PRESET_LEAD_S = 0.5


def preset_starts(actions: Sequence[SubscriberAction]) -> list[tuple[float, str]]:
    """(offset, client) shortly before each planned disconnect: ``PRESET_LEAD_S`` before it, but no earlier
    than halfway through the connection it ends.  Why before, not at, the disconnect: while the subscriber
    is connected and acknowledging, its queue is empty most of the time (an abrupt cut leaves its in-flight
    messages queued); the messages of the last moments then carry the preset ids into the backlog."""
    starts: list[tuple[float, str]] = []
    last_connect: dict[str, float] = {}
    for action in sorted(actions, key=lambda a: a.offset_s):
        if action.action == CONNECT:
            last_connect[action.client_id] = action.offset_s
        elif action.client_id in last_connect:
            since = last_connect.pop(action.client_id)
            starts.append((round(max(action.offset_s - PRESET_LEAD_S, (since + action.offset_s) / 2), 6),
                           action.client_id))
    return starts


@dataclass
class _Waiter:
    """A client fault stage waiting on the loop for its effect (sockets closed, CONNACK received)."""

    future: Future
    done: Callable[[], bool]
    evidence: Callable[[], Any]
    deadline: float


def _socket_addresses(sock: Any) -> tuple[str, str]:
    try:
        local, remote = sock.getsockname(), sock.getpeername()
        return f"{local[0]}:{local[1]}", f"{remote[0]}:{remote[1]}"
    except (OSError, AttributeError):
        return "", ""


def _tcp_established(local: str) -> bool:
    """Is a TCP connection from this local address:port still ESTABLISHED in this network namespace?
    (Read from /proc/net/tcp: the kernel's view, not the socket object's.)"""
    if not local:
        return False
    host, _, port = local.rpartition(":")
    try:
        octets = [int(part) for part in host.split(".")]
        wanted = f"{octets[3]:02X}{octets[2]:02X}{octets[1]:02X}{octets[0]:02X}:{int(port):04X}"
        with open("/proc/net/tcp") as table:
            next(table)
            return any(line.split()[1] == wanted and line.split()[3] == "01" for line in table)
    except (OSError, ValueError, IndexError):
        return False
