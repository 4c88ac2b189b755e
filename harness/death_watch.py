"""Notices a node of the target that exits or stops answering on its own, for the checkers to judge
(spark_checkers/timeline.py) and a timed-out drain to name.

- An exit outside every planned fault (a crash, an out-of-memory kill, a kill from outside the run): a
  ``node_event`` row with action "exited" — node, exit status, its last log lines (health.unplanned_exit).
  It watches every node of the target's topology that keeps count of why it is down (harness/node.py
  ProcessNode: a stop or kill, by the nemesis or the run, and a fault that makes a node kill itself set
  ``down_on_purpose`` first).
- A broker node that stops answering (a deadlock, a process stopped from outside, a full accept queue): every
  ``PROBE_INTERVAL_S`` the node is asked what its target asks it when it starts (the target's ``answers``:
  harness/external_target.py its ready check, MQTT CONNECT or port; harness/reference_target.py an MQTT
  CONNECT).  A node that fails every probe for ``UNRESPONSIVE_GRACE_S`` records a ``node_event``
  "unresponsive" (node, since when, the probe, its last error, the last log lines), and "responsive" when it
  answers again.  The watch records what it saw, paused or not: which stretches a planned fault covers (a
  pause of the node, a partition, a restart, the heal) the checkers decide from the fault rows of the same
  history (health.unresponsive).  Not probed: a node that is not running or is down on purpose (its exit is
  the exit watch's), and every node while the run heals (``hold``: heal_all restarts and waits for them).

A container node does not keep count of why it is down and is neither watched nor probed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from contracts.history_schema import Kind
from harness.history import HistoryRecorder
from harness.node import log_tail

INTERVAL_S = 0.25
LOG_LINES = 20
# How often each broker node is probed, and for how long it may fail every probe before it counts as not
# answering: the one place these are set (the checker reads the grace back from each "unresponsive" row).
PROBE_INTERVAL_S = 2.0
PROBE_TIMEOUT_S = 2.0  # what a target's probe may wait for one answer
UNRESPONSIVE_GRACE_S = 10.0


@dataclass(frozen=True)
class ProbeAnswer:
    """One probe of one node: what was asked (e.g. "MQTT CONNECT 127.0.0.2:1883") and, when it failed, why."""

    probe: str
    error: str | None = None  # None: the node answered

    @property
    def ok(self) -> bool:
        return self.error is None


Probe = Callable[[Any], ProbeAnswer]


@dataclass
class _Stretch:
    """A run of failed probes of one node."""

    since_us: int  # the recorder's clock at the first failed probe
    answer: ProbeAnswer
    reported: bool = False


class DeathWatch:
    """``nodes``: every node to watch for an exit; ``probed``: the broker nodes to probe with ``probe``
    (none without a probe)."""

    def __init__(self, nodes: Callable[[], list[Any]], recorder: HistoryRecorder, *,
                 probed: Callable[[], list[Any]] | None = None, probe: Probe | None = None,
                 grace_s: float = UNRESPONSIVE_GRACE_S, probe_interval_s: float = PROBE_INTERVAL_S) -> None:
        self.nodes = nodes
        self.recorder = recorder
        self.probed = probed if probe is not None else None
        self.probe = probe
        self.grace_s = grace_s
        self.probe_interval_s = probe_interval_s
        self._stop = threading.Event()
        self._held = threading.Event()
        self._stretches: dict[str, _Stretch] = {}
        self._threads = [threading.Thread(target=self._run, name="ordeal-death-watch", daemon=True)]
        if self.probed is not None:
            self._threads.append(threading.Thread(target=self._probe_loop, name="ordeal-probe", daemon=True))

    def start(self) -> DeathWatch:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            if thread.is_alive() and threading.current_thread() is not thread:
                thread.join(timeout=5)

    def hold(self) -> None:
        """Stop probing while the run heals every fault (nodes restart and are waited for by the heal itself);
        a stretch not yet reported is forgotten."""
        self._held.set()

    def release(self) -> None:
        self._held.clear()

    def _run(self) -> None:
        # Why poll: each node's process is our child (Popen), and its exit is only seen by asking.  A stop or
        # kill asked for sets down_on_purpose before the process goes, so only an exit nobody asked for is
        # reported, once per start of the node.
        while not self._stop.wait(INTERVAL_S):
            for node in list(self.nodes()):
                if not hasattr(node, "down_on_purpose") or node.down_on_purpose or node.exit_reported:
                    continue
                if getattr(node, "_process", None) is None or node.is_alive():
                    continue
                node.exit_reported = True
                self.recorder.record(Kind.NODE_EVENT, node=node.name, detail={
                    "action": "exited", "exit_status": node.exit_status(), "planned": False,
                    "log_tail": log_tail(node.log_path, LOG_LINES).splitlines()})

    def _probe_loop(self) -> None:
        while not self._stop.wait(self.probe_interval_s):
            if self._held.is_set():
                self._stretches = {k: v for k, v in self._stretches.items() if v.reported}
                continue
            for node in list(self.probed()):
                if self._stop.is_set() or self._held.is_set():
                    break
                self.probe_once(node)

    def probe_once(self, node: Any) -> None:
        """Probe one node and record what changed (a stretch that reached the grace, or its end)."""
        stretch = self._stretches.get(node.name)
        if not hasattr(node, "down_on_purpose") or node.down_on_purpose or not node.is_alive():
            if stretch is not None and not stretch.reported:
                del self._stretches[node.name]  # not running: not a node that stopped answering
            return
        asked_us = self.recorder.now()[0]
        try:
            answer = self.probe(node)
        except Exception as error:  # noqa: BLE001 - a probe that raises is a failed probe, in its words
            answer = ProbeAnswer("probe", f"{type(error).__name__}: {error}")
        if answer.ok:
            if stretch is not None and stretch.reported:
                now_us = self.recorder.now()[0]
                self.recorder.record(Kind.NODE_EVENT, node=node.name, detail={
                    "action": "responsive", "since_us": stretch.since_us, "probe": answer.probe,
                    "unresponsive_s": round((now_us - stretch.since_us) / 1e6, 3)})
            self._stretches.pop(node.name, None)
            return
        if stretch is None:
            stretch = self._stretches[node.name] = _Stretch(asked_us, answer)
        stretch.answer = answer
        failing_s = (self.recorder.now()[0] - stretch.since_us) / 1e6
        if not stretch.reported and failing_s >= self.grace_s:
            stretch.reported = True
            self.recorder.record(Kind.NODE_EVENT, node=node.name, detail={
                "action": "unresponsive", "since_us": stretch.since_us, "failing_s": round(failing_s, 3),
                "grace_s": self.grace_s, "probe": answer.probe, "error": answer.error,
                "log_tail": log_tail(node.log_path, LOG_LINES).splitlines()})
