"""The harness's own resources over a run: a sampler thread that, while the workload plays, appends one JSON
line every ``[scenario] resource_sample_s`` seconds (default contracts.scenario.DEFAULT_RESOURCE_SAMPLE_S;
0: off) to ``<run dir>/resources.jsonl`` (docs/history.md, "Resource samples").

What a line holds: the harness process's RSS, open file descriptors and threads (the harness is one Python
process: the history writer, the executor's clients and the nemesis are its threads; a child process of the
harness that is not a topology node counts as the harness too), the topology nodes' RSS, fds and process
count apart (the Redis, Kafka, S3 and broker processes and their descendants: not the harness), the history's
bytes on disk and Parquet part count, and the seconds since the run began.  Read from /proc (Linux); a value
that cannot be read is null.  Each line is flushed as it is written, so a killed run keeps its series.

``flat_within`` and ``leak_suspected`` are the boundedness rules benchmarks/soak.py and the soak test apply.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from contracts.history_schema import PART_GLOB
from contracts.scenario import DEFAULT_RESOURCE_SAMPLE_S

RESOURCES_FILE = "resources.jsonl"
RESOURCES_VERSION = 1
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def process_table(proc: Path = Path("/proc")) -> dict[int, tuple[int, int]]:
    """Every process visible here: pid -> (parent pid, RSS bytes)."""
    table: dict[int, tuple[int, int]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # exited meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state ppid ... rss is field 24
        try:
            table[int(entry.name)] = (int(fields[1]), int(fields[21]) * _PAGE)
        except (IndexError, ValueError):
            continue
    return table


def descendants(table: dict[int, tuple[int, int]], roots: Iterable[int]) -> set[int]:
    """The roots (those alive) and every process below them."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _rss) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    todo = [pid for pid in roots if pid in table]
    while todo:
        pid = todo.pop()
        if pid in found:
            continue
        found.add(pid)
        todo.extend(children.get(pid, ()))
    return found


def fd_count(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def thread_count(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return None


def history_usage(history_dir: Path) -> tuple[int, int]:
    """(bytes on disk of every file in the history directory, Parquet part files)."""
    total, parts = 0, 0
    try:
        entries = list(history_dir.iterdir())
    except OSError:
        return 0, 0
    for entry in entries:
        try:
            total += entry.stat().st_size
        except OSError:  # a part renamed meanwhile
            continue
        if entry.match(PART_GLOB):
            parts += 1
    return total, parts


def _sum(values: Iterable[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def take_sample(run_dir: Path, began: float, node_pids: Sequence[int], *, harness_pid: int | None = None) -> dict[str, Any]:
    """One line of the series, read now."""
    harness_pid = os.getpid() if harness_pid is None else harness_pid
    table = process_table()
    topology = descendants(table, node_pids)
    harness = descendants(table, [harness_pid]) - topology
    history_bytes, history_parts = history_usage(run_dir / "history")
    return {
        "elapsed_s": round(time.monotonic() - began, 3),
        "wall_us": time.time_ns() // 1000,
        "harness_rss_bytes": sum(table[pid][1] for pid in harness),
        "harness_fds": _sum(fd_count(pid) for pid in harness),
        "harness_threads": thread_count(harness_pid),
        "harness_processes": len(harness),
        "topology_rss_bytes": sum(table[pid][1] for pid in topology),
        "topology_fds": _sum(fd_count(pid) for pid in topology),
        "topology_processes": len(topology),
        "history_bytes": history_bytes,
        "history_parts": history_parts,
    }


class ResourceSampler:
    """A daemon thread appending ``take_sample`` lines to ``<run dir>/resources.jsonl`` every ``every_s``
    seconds, from ``start()`` (one sample at once) to ``stop()`` (one last sample).  ``node_pids`` is asked
    at every sample: a killed and restarted node has a new pid.  Never raises into the run: a sample that
    fails is skipped and counted (``errors``)."""

    def __init__(self, run_dir: Path, every_s: float = DEFAULT_RESOURCE_SAMPLE_S, *,
                 node_pids: Callable[[], Sequence[int]] = list, began: float | None = None):
        if every_s <= 0:
            raise ValueError(f"every_s must be > 0, got {every_s!r}")
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / RESOURCES_FILE
        self.every_s = every_s
        self.node_pids = node_pids
        self.began = time.monotonic() if began is None else began
        self.samples = 0
        self.errors = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> ResourceSampler:
        with self.path.open("a", encoding="utf-8") as out:
            out.write(json.dumps({"schema_version": RESOURCES_VERSION, "every_s": self.every_s,
                                  "pid": os.getpid()}, sort_keys=True) + "\n")
        self._thread = threading.Thread(target=self._loop, name="resource-sampler", daemon=True)
        self._thread.start()
        return self

    def sample_now(self) -> None:
        with self._lock:
            try:
                pids = [int(pid) for pid in self.node_pids() if pid]
                line = take_sample(self.run_dir, self.began, pids)
                with self.path.open("a", encoding="utf-8") as out:
                    out.write(json.dumps(line, sort_keys=True) + "\n")
                self.samples += 1
            except Exception as error:  # noqa: BLE001 - a diagnostic never breaks the run
                self.errors += 1
                if self.errors == 1:  # said once, in the file: a series with gaps says why
                    self._write({"sample_error": f"{type(error).__name__}: {error}"})

    def _write(self, line: dict[str, Any]) -> None:
        try:
            with self.path.open("a", encoding="utf-8") as out:
                out.write(json.dumps(line, sort_keys=True) + "\n")
        except OSError:
            pass

    def _loop(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            self.sample_now()
            next_at += self.every_s
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def stop(self) -> None:
        """Stop the thread and take one last sample (idempotent)."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        self.sample_now()


def topology_pids(topology: Any) -> Callable[[], list[int]]:
    """The running nodes' pids of a topology (a containers node may have none: then nothing)."""
    def pids() -> list[int]:
        found = []
        nodes = getattr(topology, "nodes", None)
        for node in list((nodes() if callable(nodes) else nodes) or []):
            try:
                pid = node.pid
            except Exception:  # noqa: BLE001 - a node that cannot say is not counted
                pid = None
            if isinstance(pid, int) and pid > 0:
                found.append(pid)
        return found
    return pids


def read_series(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the header line, the samples in order) of a resources.jsonl; a torn last line is left out."""
    header: dict[str, Any] = {}
    samples: list[dict[str, Any]] = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "schema_version" in row:
            header = row
        elif "sample_error" in row:
            header.setdefault("sample_errors", []).append(row["sample_error"])
        else:
            samples.append(row)
    return header, samples


def at(samples: Sequence[dict[str, Any]], elapsed_s: float) -> dict[str, Any] | None:
    """The first sample at or after ``elapsed_s`` seconds (None when the series ends before)."""
    return next((s for s in samples if s["elapsed_s"] >= elapsed_s), None)


def max_min_ratio(values: Sequence[float]) -> float | None:
    """max / min of a series of positive values (None when empty or a value is not positive)."""
    known = [v for v in values if v is not None]
    if not known or min(known) <= 0:
        return None
    return max(known) / min(known)


def flat_within(values: Sequence[float], ratio: float) -> bool:
    """Whether the series stays within ``ratio`` (max / min), e.g. 1.10 for "flat within 10 %"."""
    measured = max_min_ratio(values)
    return measured is not None and measured <= ratio


def leak_suspected(values: Sequence[float], bound: float) -> bool:
    """A series that never goes down and ends more than ``bound`` above where it began (an fd or memory
    leak climbs monotonically; a working set goes up and down)."""
    known = [v for v in values if v is not None]
    if len(known) < 2:
        return False
    never_down = all(b >= a for a, b in zip(known, known[1:], strict=False))
    return never_down and known[-1] - known[0] > bound


def cadence(samples: Sequence[dict[str, Any]]) -> list[float]:
    """The gaps between consecutive samples, seconds."""
    times = [s["elapsed_s"] for s in samples]
    return [round(b - a, 3) for a, b in zip(times, times[1:], strict=False)]
