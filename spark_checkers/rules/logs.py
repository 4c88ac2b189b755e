"""The log oracle: every node's log (history/logs.parquet) judged against the scenario's declared patterns.

Pure Python + pyarrow: the table holds the few thousand lines a run's nodes write, and the patterns are
Python regular expressions (validated when the scenario loads), so the same engine that validates them
decides them.  Each record goes to the first pattern that applies to its node (role, node-name glob) and
matches; its verdict says where it counts: ``fail`` -> logs.error_lines (a violation), ``report`` ->
logs.reported_lines (counted, never failing), ``ignore`` -> nowhere.  Lines that belong together (a
traceback under the error line that logged it, a multi-line report printed with one time stamp) are one
record, judged as a whole and counted once: one *incident*, one witness.  Unknown is never a pass: a node whose log could not be read, or
was cut, leaves an absence unproven, and the verdict names that node.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contracts.history_schema import LogSource, read_log_table
from contracts.invariants import HARNESS_LOG_MARKER, LogPattern

ERROR_LINES, REPORTED_LINES = "logs.error_lines", "logs.reported_lines"
LOG_INVARIANTS = (ERROR_LINES, REPORTED_LINES)
VERDICT_OF = {"fail": ERROR_LINES, "report": REPORTED_LINES}
SHOWN = 10  # witnesses shown per invariant (all are counted)
CONTEXT_LINES = 12  # continuation lines kept with an incident (a traceback's frames and its exception)


@dataclass
class LogFinding:
    """What one log invariant found in one run, before its verdict (spark_checkers/api.py decides)."""

    count: int = 0
    witnesses: list[dict[str, Any]] = field(default_factory=list)  # {"text", "data"}, the first SHOWN
    unknown: str | None = None  # why an absence proves nothing (a node's log unread or cut)
    not_applicable: str | None = None  # no pattern of this verdict declared
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Incident:
    pattern: LogPattern
    node: str
    role: str
    line_no: int
    last_line_no: int
    t_wall_us: int | None
    t_mono_us: int | None
    line: str
    lines: int = 1
    context: list[str] = field(default_factory=list)


def _applies(pattern: LogPattern, node: str, role: str) -> bool:
    return ((not pattern.roles or role in pattern.roles)
            and (not pattern.nodes or any(fnmatch.fnmatchcase(node, glob) for glob in pattern.nodes)))


_INDENTED = re.compile(r"^(\S+ \S+ \S+ \S+)  ")  # a report's next line: its prefix, then an indented message


def _continues(line: str, first: str) -> bool:
    """Same stamp, same four-token prefix (time, level, process) and an indented message: the next line of
    one report (RabbitMQ).  Two log calls in the same millisecond (Python logging) stay two records."""
    match = _INDENTED.match(line)
    return match is not None and match[1] == " ".join(first.split()[:4])


def _records(rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """One node's lines (in order) cut into records: a line with its own time stamp starts one; the lines
    after it without a time stamp (the traceback under the ERROR line that logged it) and those with the very
    same stamp and prefix and an indented message (the next lines of one multi-line report: RabbitMQ repeats
    its prefix on each) belong to it.
    A line without a stamp after a line without one is a record of its own (Tansu prints no stamps)."""
    records: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] | None = None
    for row in rows:
        if row["line"].startswith(HARNESS_LOG_MARKER):
            current = None  # the harness's own line (a node start): judged never, and it ends a record
            continue
        t, first = row["t_wall_us"], (current[0]["t_wall_us"] if current else None)
        if current is not None and first is not None and (t is None or (t == first and _continues(
                row["line"], current[0]["line"]))):
            current.append(row)
            continue
        current = [row]
        records.append(current)
    return records


def match_lines(rows: list[dict[str, Any]], patterns: tuple[LogPattern, ...]) -> list[_Incident]:
    """Incidents in ``rows`` (one node's or many; each row: node, role, line_no, t_wall_us, t_mono_us, line),
    in node and line order.  Each record (_records) is one candidate incident: the first applicable pattern
    whose regex is found in the record's text (its lines joined by newlines; ^ and $ match at each line)
    decides it; its witness line is the line where the match starts."""
    compiled = [(p, re.compile(p.regex, re.MULTILINE)) for p in patterns]
    by_node: dict[str, list[dict[str, Any]]] = {}
    for row in sorted(rows, key=lambda r: (r["node"], r["line_no"])):
        by_node.setdefault(row["node"], []).append(row)
    incidents: list[_Incident] = []
    for node, node_rows in by_node.items():
        role = node_rows[0].get("role") or ""
        applicable = [(p, r) for p, r in compiled if _applies(p, node, role)]
        if not applicable:
            continue
        for record in _records(node_rows):
            text = "\n".join(row["line"] for row in record)
            hit = next(((p, m) for p, r in applicable if (m := r.search(text))), None)
            if hit is None or hit[0].verdict == "ignore":
                continue
            pattern, found = hit
            at = text.count("\n", 0, found.start())  # the record's line where the match starts
            row = record[at]
            incidents.append(_Incident(pattern, node, role, row["line_no"], record[-1]["line_no"],
                                       record[0]["t_wall_us"], record[0]["t_mono_us"], row["line"],
                                       lines=len(record),
                                       context=[r["line"] for i, r in enumerate(record) if i != at][:CONTEXT_LINES]))
    return incidents


def judge_logs(history_dir: Path, patterns: tuple[LogPattern, ...], origin_us: int = 0
               ) -> dict[str, LogFinding]:
    """The two log invariants of one run.  ``origin_us``: the run's first event time (t_mono_us), so the
    witnesses' times read like every other witness's (seconds since the start of the run)."""
    findings = {invariant: LogFinding() for invariant in LOG_INVARIANTS}
    for verdict, invariant in VERDICT_OF.items():
        if not any(p.verdict == verdict for p in patterns):
            findings[invariant].not_applicable = (
                f"the scenario declares no log pattern with verdict {verdict!r} for this target "
                f"([checks.logs]; docs/scenarios.md)")
    try:
        table, sources = read_log_table(history_dir)
    except FileNotFoundError:
        why = (f"{Path(history_dir) / 'logs.parquet'} is missing: the run recorded no node logs (a run made "
               "before the log oracle, or one whose harness died before its nodes stopped)")
        for finding in findings.values():
            finding.unknown = why
        return findings
    except ValueError as error:
        for finding in findings.values():
            finding.unknown = str(error)
        return findings
    unread = [_unread(s) for s in sources if s.error or s.truncated]
    if not sources:
        unread = ["the run recorded no node at all (its target never started a node)"]
    incidents = match_lines(table.to_pylist(), patterns)
    lines: dict[str, dict[str, dict[str, int]]] = {ERROR_LINES: {}, REPORTED_LINES: {}}
    for incident in incidents:
        invariant = VERDICT_OF[incident.pattern.verdict]
        finding = findings[invariant]
        finding.count += 1
        per_node = lines[invariant].setdefault(incident.node, {})
        per_node[incident.pattern.name] = per_node.get(incident.pattern.name, 0) + 1
        if len(finding.witnesses) < SHOWN:
            finding.witnesses.append(_witness(incident, origin_us))
    for invariant, finding in findings.items():
        finding.details = {"incidents": lines[invariant], "nodes": [_source(s) for s in sources]}
        if unread:
            finding.details["unread"] = unread
            # Presence proves a failure; an absence over unread logs proves nothing (unknown, naming them).
            if not (invariant == ERROR_LINES and finding.count):
                finding.unknown = "; ".join(unread)
    return findings


def _unread(source: LogSource) -> str:
    if source.error:
        return f"the log of node {source.node} ({source.file}) could not be read: {source.error}"
    return (f"the log of node {source.node} ({source.file}) was cut after {source.lines} lines "
            f"({source.bytes} bytes): the rest was not judged")


def _source(source: LogSource) -> dict[str, Any]:
    return {"node": source.node, "role": source.role, "file": source.file, "lines": source.lines,
            **({"error": source.error} if source.error else {}), **({"truncated": True} if source.truncated else {})}


def _witness(incident: _Incident, origin_us: int) -> dict[str, Any]:
    at = "at an unknown time" if incident.t_mono_us is None else f"at {(incident.t_mono_us - origin_us) / 1e6:.3f} s"
    more = f" (+{incident.lines - 1} more line(s))" if incident.lines > 1 else ""
    text = (f"{incident.node} {at}, line {incident.line_no}: {incident.line.strip()}{more} -- pattern "
            f"{incident.pattern.name!r} ({incident.pattern.verdict}"
            f"{': ' + incident.pattern.why if incident.pattern.why else ''})")
    data = {"node": incident.node, "role": incident.role, "line_no": incident.line_no, "line": incident.line,
            "t": incident.t_mono_us, "t_wall_us": incident.t_wall_us, "pattern": incident.pattern.name,
            "verdict": incident.pattern.verdict, "lines": incident.lines, "context": incident.context}
    return {"text": text, "data": data}
