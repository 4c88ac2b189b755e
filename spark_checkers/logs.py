"""The log oracle: every node's log (history/logs.parquet) judged against the scenario's declared patterns.

Pure Python + pyarrow: the table holds the few thousand lines a run's nodes write, and the patterns are
Python regular expressions (validated when the scenario loads), so the same engine that validates them
decides them.  Each line goes to the first pattern that applies to its node (role, node-name glob) and
matches; its verdict says where the line counts: ``fail`` -> logs.error_lines (a violation), ``report`` ->
logs.reported_lines (counted, never failing), ``ignore`` -> nowhere.  Lines that belong together (a
traceback under the error line that logged it, a multi-line report printed with one time stamp) make one
*incident*: one witness, counted once.  Unknown is never a pass: a node whose log could not be read, or
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


def match_lines(rows: list[dict[str, Any]], patterns: tuple[LogPattern, ...]) -> list[_Incident]:
    """Incidents in ``rows`` (one node's or many; each row: node, role, line_no, t_wall_us, t_mono_us, line),
    in node and line order.  The first applicable pattern that matches decides a line."""
    compiled = [(p, re.compile(p.regex)) for p in patterns]
    by_node: dict[tuple[str, str], list[tuple[LogPattern, re.Pattern[str]]]] = {}
    incidents: list[_Incident] = []
    open_incident: dict[str, _Incident] = {}
    for row in sorted(rows, key=lambda r: (r["node"], r["line_no"])):
        node, role, line = row["node"], row.get("role") or "", row["line"]
        if line.startswith(HARNESS_LOG_MARKER):
            open_incident.pop(node, None)
            continue
        applicable = by_node.get((node, role))
        if applicable is None:
            applicable = by_node[(node, role)] = [(p, r) for p, r in compiled if _applies(p, node, role)]
        hit = next((p for p, r in applicable if r.search(line)), None)
        current = open_incident.get(node)
        follows = current is not None and row["line_no"] == current.last_line_no + 1
        # Why fold: a line without its own time stamp right under an incident is its continuation (the
        # traceback of an ERROR line); a line of the same pattern with the same stamp is the next line of one
        # multi-line report (RabbitMQ repeats its prefix on each).  Folded lines are one witness, counted once.
        if follows and (row["t_wall_us"] is None or (hit is not None and hit.name == current.pattern.name
                                                     and row["t_wall_us"] == current.t_wall_us)):
            current.last_line_no = row["line_no"]
            current.lines += 1
            if hit is not None and hit.verdict == "fail" and current.pattern.verdict != "fail":
                current.pattern = hit  # a traceback under a reported line makes the incident a failure
            if len(current.context) < CONTEXT_LINES:
                current.context.append(line)
            continue
        if hit is None or hit.verdict == "ignore":
            open_incident.pop(node, None)
            continue
        incident = _Incident(hit, node, role, row["line_no"], row["line_no"], row["t_wall_us"], row["t_mono_us"],
                             line)
        incidents.append(incident)
        open_incident[node] = incident
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
