"""Collect every node's log into the history (history/logs.parquet, contracts/history_schema.py LOG_SCHEMA).

The harness only copies: each line with its node, line number and the time the line itself carries (parsed
from the formats the nodes write: Python logging, Redis, RabbitMQ, Mosquitto, werkzeug, ISO 8601).  Which
lines matter is the checkers' decision (spark_checkers/rules/logs.py), from the scenario's declared patterns, so a
stored run can be judged again with other patterns.  A log that cannot be read is recorded as such (its
source carries the error): the checker then says unknown, naming the node.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa

from contracts.history_schema import LOG_SCHEMA, LogSource, write_log_table
from contracts.topology import Target

# Beyond this many bytes of one node's log the rest is not stored (its source says truncated: the checker
# answers unknown for that node rather than pass on a part of its log).
MAX_LOG_BYTES = 256 * 1024 * 1024


def _local(text: str, form: str) -> int:
    """Local wall time (as the node printed it) -> µs since the epoch."""
    return int(datetime.datetime.strptime(text, form).timestamp() * 1_000_000)


# (regex, converter) per log format; the first that matches the start of a line gives its time.
_TIME_FORMATS: tuple[tuple[re.Pattern[str], Any], ...] = (
    # Python logging (the reference broker): "2026-11-24 11:10:58,893 broker-1 WARNING ..."
    (re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) "),
     lambda m: _local(m[1], "%Y-%m-%d %H:%M:%S") + int(m[2]) * 1000),
    # RabbitMQ: "2026-11-24 10:29:19.228794+00:00 [warning] <0.620.0> ..."
    (re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}[+-]\d\d:\d\d) "),
     lambda m: int(datetime.datetime.fromisoformat(m[1]).timestamp() * 1_000_000)),
    # ISO 8601 with a zone (Rust tracing, Tansu): "2026-11-24T11:10:21.123456Z ..."
    (re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d))"),
     lambda m: int(datetime.datetime.fromisoformat(m[1].replace("Z", "+00:00")).timestamp() * 1_000_000)),
    # Redis: "1234:M 24 Nov 2026 11:10:21.123 # ..."
    (re.compile(r"^\d+:[A-Z] (\d{1,2} [A-Z][a-z]{2} \d{4} \d\d:\d\d:\d\d)\.(\d{3}) "),
     lambda m: _local(m[1], "%d %b %Y %H:%M:%S") + int(m[2]) * 1000),
    # Mosquitto: "1763982621: New connection from ..."
    (re.compile(r"^(\d{9,11}): "), lambda m: int(m[1]) * 1_000_000),
    # werkzeug access log (moto, the S3 stand-in): '127.0.0.1 - - [24/Nov/2026 11:10:21] "GET ...'
    (re.compile(r"^\S+ - - \[(\d\d/[A-Z][a-z]{2}/\d{4} \d\d:\d\d:\d\d)\] "),
     lambda m: _local(m[1], "%d/%b/%Y %H:%M:%S")),
)


def line_time_us(line: str) -> int | None:
    """The wall time a log line carries at its start, in µs since the epoch; None when it carries none."""
    for pattern, convert in _TIME_FORMATS:
        match = pattern.match(line)
        if match:
            try:
                return convert(match)
            except (ValueError, OverflowError):
                return None
    return None


def node_logs(target: Target) -> list[tuple[str, str, Path]]:
    """(name, role, log path) of every node the target started (before it stops: a container's handle goes)."""
    kept = target.log_files()
    if kept is not None:  # a kept topology (harness/local/keeper.py): the seed's slice of each node's log
        return kept
    topology = target.topology
    nodes = list(topology.nodes()) if topology is not None else []
    own_node = getattr(target, "node", None)  # an external target's broker (as a container it has no topology)
    if not nodes and own_node is not None:
        nodes = [own_node]
    return [(n.name, str(getattr(n, "role", "") or ""), Path(n.log_path)) for n in nodes
            if getattr(n, "log_path", None) is not None]


def read_node_log(name: str, role: str, path: Path, run_dir: Path, max_bytes: int = MAX_LOG_BYTES
                  ) -> tuple[list[str], LogSource]:
    try:
        relative = str(path.resolve().relative_to(run_dir.resolve()))
    except ValueError:
        relative = str(path)
    try:
        with open(path, "rb") as handle:
            data = handle.read(max_bytes + 1)
    except OSError as error:
        return [], LogSource(name, role, relative, error=f"{type(error).__name__}: {error.strerror or error}")
    truncated = len(data) > max_bytes
    if truncated:
        data = data[:max_bytes].rsplit(b"\n", 1)[0]
    lines = data.decode(errors="replace").splitlines()
    return lines, LogSource(name, role, relative, lines=len(lines), bytes=len(data), truncated=truncated)


def collect_logs(history_dir: str | Path, run_dir: str | Path, nodes: Iterable[tuple[str, str, Path]],
                 started_wall_us: int, max_bytes: int = MAX_LOG_BYTES) -> Path:
    """Write history/logs.parquet from the nodes' log files; returns its path."""
    run_dir = Path(run_dir)
    columns: dict[str, list[Any]] = {name: [] for name in LOG_SCHEMA.names}
    sources: list[LogSource] = []
    for name, role, path in nodes:
        lines, source = read_node_log(name, role, Path(path), run_dir, max_bytes)
        sources.append(source)
        for number, line in enumerate(lines, start=1):
            wall = line_time_us(line)
            columns["node"].append(name)
            columns["role"].append(role)
            columns["line_no"].append(number)
            columns["t_wall_us"].append(wall)
            columns["t_mono_us"].append(None if wall is None else wall - started_wall_us)
            columns["line"].append(line)
    table = pa.table(columns, schema=LOG_SCHEMA)
    return write_log_table(history_dir, table, sources)
