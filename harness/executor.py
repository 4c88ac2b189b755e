"""The executor: plays a plan in real time against a target's MQTT endpoints and records what happens.

Everything runs on the calling thread: one loop that alternates between "run every plan event that is
due" and "wait on the selector until the next event is due" (harness/clients.py says why not a thread per
client).  If the loop falls behind, events run late and the history shows their real times.

Phases (each recorded as a ``phase`` row by harness/run.py around these calls):
- ``connect_all()``: every publisher connects, every subscriber's offset-0 connect runs; waits until all
  are connected and subscribed, so the workload starts with every subscription in place.
- ``play()``: the plan's publishes and subscriber actions at their offsets (offset 0 = workload start).
- ``settle()``: waits for the outstanding publish acknowledgements; what is left becomes indeterminate.
- ``drain()``: every persistent subscriber reconnects (clean_start = 0) and the loop runs until nothing
  new is delivered for quiet_s (reason "quiet") or timeout_s passes (reason "timeout").
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from harness.clients import ClientSession, Counters, SelectorLoop
from harness.history import HistoryRecorder
from properties.plan import CONNECT, Plan, PublishPlan, SubscriberAction

Endpoint = tuple[str, int, str]  # host, port, node name


class ExecutorError(RuntimeError):
    """The executor cannot go on (e.g. no client could connect at all)."""


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
    # (faults/targets.py client_hosts: with distinct node addresses 127.0.0.1 is the clients').
    client_bind_address: str = ""


class Executor:
    def __init__(self, plan: Plan, endpoints: Sequence[Endpoint], recorder: HistoryRecorder, *,
                 settings: ExecutorSettings | None = None, stop: threading.Event | None = None):
        if not endpoints:
            raise ExecutorError("the target exposes no MQTT endpoint")
        self.plan = plan
        self.endpoints = list(endpoints)
        self.recorder = recorder
        self.settings = settings or ExecutorSettings()
        self.stop = stop or threading.Event()
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
                node=c.node)
            for c in plan.clients}
        self._last_housekeeping = 0.0

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
        if action.action == CONNECT:
            session.connect(clean_start=action.clean_start, node=action.node,
                            session_expiry_s=action.session_expiry_s, why=why)
        else:
            session.disconnect(abrupt=action.abrupt, why=why)

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
            session.connect(clean_start=False, node=session.node, session_expiry_s=session.plan.session_expiry_s,
                            why="drain")
        # Quiet = every subscriber connected and subscribed, and no new delivery for quiet_s.
        reason = "timeout"
        while not self.stop.is_set():
            now = time.monotonic()
            all_up = all(s.subscribed for s in subscribers)
            last_news = max(self.counters.last_delivery_mono, started)
            if all_up and now - last_news >= quiet_s:
                reason = "quiet"
                break
            if now >= deadline:
                break
            self._pump(min(deadline, now + self.settings.max_wait_s))
        if self.stop.is_set():
            reason = "stopped"
        not_connected = sorted(s.client_id for s in subscribers if not s.subscribed)
        return {"reason": reason, "elapsed_s": round(time.monotonic() - started, 3),
                "subscribers_not_connected": not_connected}

    def _writing(self) -> bool:
        return False

    def close(self) -> None:
        """Disconnect everyone cleanly (recorded) and release the sockets."""
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
