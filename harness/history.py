"""The history writer: a thread-safe recorder of observations into schema-versioned Parquet part files.

Rows are buffered in memory and a background thread writes a part file (``events-NNNNN.parquet``) every
``flush_rows`` rows or every ``flush_interval_s`` seconds, whichever comes first.  Each part is written to
a temporary name and renamed, and ``manifest.json`` is rewritten (also atomically) after every part, so at
any moment the directory holds only whole part files and a manifest that lists them.  The manifest says
``"complete": false`` until ``close()`` is called after the ``run_end`` phase row: a crashed or killed run
leaves a readable history that says it is incomplete.  Schema: contracts/history_schema.py, docs/history.md.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from contracts.history_schema import (
    COLUMNS,
    EVENT_SCHEMA,
    MANIFEST_NAME,
    PART_GLOB,
    Kind,
    Manifest,
    PartInfo,
    Phase,
    write_manifest,
    write_part,
)

_SETTABLE = frozenset(COLUMNS) - {"seq", "kind"}


class HistoryError(RuntimeError):
    """A history that cannot be written or read."""


class HistoryRecorder:
    """Append-only recorder.  ``record(kind, **columns)`` from any thread; ``close()`` once at the end."""

    def __init__(self, directory: str | Path, *, run_id: str, flush_rows: int = 5000,
                 flush_interval_s: float = 1.0, mono_origin_ns: int | None = None,
                 meta: Mapping[str, Any] | None = None):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        if any(self.directory.glob(PART_GLOB)) or (self.directory / MANIFEST_NAME).exists():
            raise HistoryError(f"{self.directory}: already holds a history; use a fresh directory")
        self.run_id = run_id
        self.meta = dict(meta or {})  # extra manifest keys (scenario, seed)
        self.flush_rows = flush_rows
        self.flush_interval_s = flush_interval_s
        self.mono_origin_ns = time.monotonic_ns() if mono_origin_ns is None else mono_origin_ns
        self.started_wall_us = time.time_ns() // 1000
        self._lock = threading.Lock()  # guards _seq, _buffer, _counts, _closed
        self._write_lock = threading.Lock()  # one part file at a time, in seq order
        self._buffer: list[dict[str, Any]] = []
        self._seq = 0
        self._counts: Counter[str] = Counter()
        self._parts: list[PartInfo] = []
        self._run_end_seen = False
        self._closed = False
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._write_manifest(complete=False)
        self._thread = threading.Thread(target=self._flush_loop, name="history-flush", daemon=True)
        self._thread.start()

    # -- recording ----------------------------------------------------------------------------------
    def now(self) -> tuple[int, int]:
        """(t_mono_us since the run's origin, t_wall_us since the epoch), for callers that stamp first."""
        return (time.monotonic_ns() - self.mono_origin_ns) // 1000, time.time_ns() // 1000

    def record(self, kind: str, *, detail: Mapping[str, Any] | None = None, t_mono_us: int | None = None,
               t_wall_us: int | None = None, **columns: Any) -> int:
        """Record one observation; returns its seq.  Unknown kinds or columns are programming errors."""
        if kind not in Kind.ALL:
            raise HistoryError(f"unknown history kind {kind!r}; see contracts/history_schema.Kind")
        unknown = set(columns) - _SETTABLE
        if unknown:
            raise HistoryError(f"unknown history column(s) {sorted(unknown)}; see contracts/history_schema.py")
        if t_mono_us is None or t_wall_us is None:
            mono, wall = self.now()
            t_mono_us = mono if t_mono_us is None else t_mono_us
            t_wall_us = wall if t_wall_us is None else t_wall_us
        row = dict(columns)
        row["kind"] = kind
        row["t_mono_us"] = t_mono_us
        row["t_wall_us"] = t_wall_us
        if detail is not None:
            row["detail"] = json.dumps(detail, sort_keys=True, separators=(",", ":"), default=str)
        with self._lock:
            if self._closed:
                raise HistoryError("the history is closed; nothing more can be recorded")
            if self._error is not None:
                raise HistoryError(f"the history writer failed: {self._error}") from self._error
            self._seq += 1
            row["seq"] = self._seq
            self._buffer.append(row)
            self._counts[kind] += 1
            if kind == Kind.PHASE and detail is not None and detail.get("phase") == Phase.RUN_END:
                self._run_end_seen = True
            full = len(self._buffer) >= self.flush_rows
        if full:
            self._wake.set()
        return row["seq"]

    def phase(self, phase: str, **detail: Any) -> int:
        return self.record(Kind.PHASE, detail={"phase": phase, **detail})

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    # -- flushing -----------------------------------------------------------------------------------
    def _flush_loop(self) -> None:
        # Wake on a full buffer or every interval; stop only after a last flush (close() sets _stop).
        while not self._stop.is_set():
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            try:
                self.flush()
            except BaseException as error:  # surfaced on the next record() / close()
                with self._lock:
                    self._error = error
                return

    def flush(self) -> None:
        """Write everything buffered so far as one part file (no-op when empty)."""
        with self._write_lock:
            with self._lock:
                rows, self._buffer = self._buffer, []
                counts = dict(self._counts)
            if not rows:
                return
            table = pa.Table.from_pylist(rows, schema=EVENT_SCHEMA)
            self._parts.append(write_part(self.directory, len(self._parts), table))
            self._write_manifest(complete=False, counts=counts)

    def _write_manifest(self, *, complete: bool, counts: Mapping[str, int] | None = None,
                        reason: str = "") -> None:
        incomplete_reason = "" if complete else (reason or "the run has not finished (or was killed)")
        write_manifest(self.directory, Manifest(
            run_id=self.run_id, complete=complete, parts=tuple(self._parts), incomplete_reason=incomplete_reason,
            end_reason="run_end" if complete else incomplete_reason, started_wall_us=self.started_wall_us,
            updated_wall_us=time.time_ns() // 1000, counts_recorded=dict(counts or {}), meta=self.meta))

    def close(self, *, reason: str = "") -> bool:
        """Flush, stop the writer, and mark the history complete if the run_end phase was recorded.
        Returns whether it was marked complete.  ``reason`` explains an incomplete close."""
        with self._lock:
            if self._closed:
                return self._run_end_seen and not reason
            self._closed = True
        self._stop.set()
        self._wake.set()
        self._thread.join()
        self.flush()
        if self._error is not None:
            raise HistoryError(f"the history writer failed: {self._error}") from self._error
        complete = self._run_end_seen and not reason
        if not complete and not reason:
            reason = "closed before the run_end phase"
        self._write_manifest(complete=complete, counts=self.counts(), reason=reason)
        return complete

    def __enter__(self) -> HistoryRecorder:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close(reason="" if exc_info[0] is None else f"the run raised {exc_info[0].__name__}")


# -- reading ----------------------------------------------------------------------------------------


def read_manifest(directory: str | Path) -> dict[str, Any]:
    path = Path(directory) / MANIFEST_NAME
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise HistoryError(f"{path}: no manifest; not a history directory") from None
    except json.JSONDecodeError as error:
        raise HistoryError(f"{path}: unreadable manifest: {error}") from error


def read_history(directory: str | Path) -> pa.Table:
    """Every part file of a history as one table ordered by seq (the manifest is not required)."""
    directory = Path(directory)
    parts = sorted(directory.glob(PART_GLOB))
    if not parts:
        return EVENT_SCHEMA.empty_table()
    tables = [pq.read_table(p, schema=EVENT_SCHEMA) for p in parts]
    return pa.concat_tables(tables).sort_by("seq")
