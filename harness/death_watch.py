"""Notices a node that exits outside every planned fault (a crash, an out-of-memory kill, a kill from
outside the run): a ``node_event`` row with action "exited" — node, exit status, its last log lines — for the
checkers to judge (spark_checkers/timeline.py, health.unplanned_exit) and a timed-out drain to name.

It watches every node of the target's topology that keeps count of why it is down (harness/node.py
ProcessNode: a stop or kill, by the nemesis or the run, and a fault that makes a node kill itself set
``down_on_purpose`` first).  A container node does not keep that count and is not watched.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from contracts.history_schema import Kind
from harness.history import HistoryRecorder
from harness.node import log_tail

INTERVAL_S = 0.25
LOG_LINES = 20


class DeathWatch:
    def __init__(self, nodes: Callable[[], list[Any]], recorder: HistoryRecorder) -> None:
        self.nodes = nodes
        self.recorder = recorder
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ordeal-death-watch", daemon=True)

    def start(self) -> DeathWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)

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
