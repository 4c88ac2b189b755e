"""report.json (the machine truth), junit.xml (CI), report.html (auditors) and the terminal table.

Everything a command prints about a checked run is read from its report dict here: the verdict table and
``summary_lines`` (verdict, exit code, every failing and unknown invariant with its count, whether the history
is complete), so what the terminal says can never disagree with report.json.  The words every output shares
(an invariant's normative statement, what its verdict covers, the target's declaration) live here too."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contracts.invariants import BY_ID
from contracts.versions import read_json
from spark_checkers.junit import Case
from spark_checkers.junit import junit_xml as write_junit

REPORT_JSON, JUNIT_XML, REPORT_HTML = "report.json", "junit.xml", "report.html"
HISTORY_INVARIANT = "meta.history_complete"
# The verdicts a reader must act on, worst first: each is named in every output with its count.
ACTIONABLE = ("fail", "unknown")


def write_reports(run_dir: Path, report: dict[str, Any]) -> None:
    run_dir = Path(run_dir)
    (run_dir / REPORT_JSON).write_text(json.dumps(report, indent=2, default=str))
    render_from_report(run_dir, report)


def render_from_report(run_dir: Path, report: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write junit.xml and report.html from report.json (``ordeal report``)."""
    run_dir = Path(run_dir)
    if report is None:
        path = run_dir / REPORT_JSON
        try:
            report = read_json(path)  # refuses an unknown schema_version, naming the file
        except FileNotFoundError as error:
            raise FileNotFoundError(f"{path} is missing: run 'ordeal check {run_dir}' first") from error
        if not isinstance(report, dict) or "invariants" not in report:
            raise ValueError(f"{path}: not an Ordeal report (no 'invariants' list)")
    (run_dir / JUNIT_XML).write_text(junit_xml(report))
    from spark_checkers.html import render_html

    (run_dir / REPORT_HTML).write_text(render_html(report))
    return report


# -- the words every output shares ------------------------------------------------------------------------

def statement_of(item: dict[str, Any]) -> str:
    """The normative statement an invariant checks (contracts/invariants.py Invariant.statement; a report that
    carries its own wins), or ''."""
    if item.get("statement"):
        return str(item["statement"])
    invariant = BY_ID.get(item.get("id", ""))
    return invariant.statement if invariant is not None else ""


def covers_words(item: dict[str, Any]) -> str:
    """What the verdict judged (report.json "covers", e.g. {"acknowledged": 120, "owed": 118}) as
    "120 acknowledged, 118 owed"; '' when the report has none."""
    covers = item.get("covers") or {}
    return ", ".join(f"{value} {key.replace('_', ' ')}" for key, value in covers.items())


def actionable(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The failing invariants, then the unknown ones, each in report order."""
    return [i for verdict in ACTIONABLE for i in report["invariants"] if i["verdict"] == verdict]


@dataclass(frozen=True)
class HistoryState:
    """Whether the checked history was complete, as report.json says it: "yes", "no" (the reasons), or
    "unknown" (it could not be read or judged: the reason)."""

    state: str
    why: str = ""

    def words(self) -> str:
        return f"history complete: {self.state}" + (f" ({self.why})" if self.why else "")


def history_state(report: dict[str, Any]) -> HistoryState:
    history = report.get("history") or {}
    item = next((i for i in report["invariants"] if i["id"] == HISTORY_INVARIANT), None)
    if history.get("fatal"):
        return HistoryState("unknown", "; ".join(history["fatal"]))
    if history.get("incomplete"):
        return HistoryState("no", "; ".join(history["incomplete"]))
    if item is None:
        return HistoryState("unknown", f"the report has no {HISTORY_INVARIANT} verdict")
    if item["verdict"] == "pass":
        return HistoryState("yes")
    return HistoryState("no" if item["verdict"] == "fail" else "unknown", item.get("reason") or "")


def summary_lines(report: dict[str, Any], width: int = 220) -> list[str]:
    """What every command prints last about a checked run, from its report alone: the verdict and exit code,
    each failing and unknown invariant with its count (and an unknown one's reason), whether the history is
    complete."""
    lines = [f"verdict: {report['verdict']} (exit {report['exit_code']})"]
    lines += [f"  fail {item['id']} ×{item['count']}" for item in actionable(report) if item["verdict"] == "fail"]
    # Unknown ones grouped by their reason (an incomplete history makes a dozen unknown for one reason).
    by_reason: dict[str, list[str]] = {}
    for item in actionable(report):
        if item["verdict"] == "unknown":
            by_reason.setdefault(item.get("reason") or "", []).append(f"{item['id']} ×{item['count']}")
    for reason, named in by_reason.items():
        lines.append(f"  unknown {', '.join(named)}" + (f": {reason}"[:width] if reason else ""))
    lines.append(history_state(report).words()[:width])
    return lines


def declaration_rows(guarantees: dict[str, Any] | None) -> list[tuple[str, str, str]]:
    """The target's declaration (report.json "guarantees") as (promise, in words, what it changes in judging),
    for the page's "What the target promises" table."""
    if not guarantees:
        return [("declaration", "none recorded (the run has no readable scenario.json)",
                 "every invariant is unknown: nothing can be judged without the declared guarantees")]
    promises = guarantees.get("promises") or {}
    rows: list[tuple[str, str, str]] = []
    kind = guarantees.get("target_kind")
    rows.append(("target", "the reference broker (white box: its Redis state is read after the drain)"
                 if kind == "reference" else f"{guarantees.get('target_name') or 'an MQTT broker'} (black box)",
                 "the whitebox.* invariants apply" if kind == "reference"
                 else "the whitebox.* invariants are not applicable; every other rule judges what its clients saw"))
    nodes = guarantees.get("target_nodes") or []
    if len(nodes) > 1:
        rows.append(("clustered nodes", ", ".join(nodes),
                     "a fault on any of them is a fault of the target; clients connect to and move between them"))
    versions = promises.get("mqtt_versions")
    if versions:
        rows.append(("MQTT versions", " and ".join(versions),
                     "the workload speaks only these; rules about MQTT 5 packets are not applicable without an "
                     "MQTT 5 connection"))
    persistence = promises.get("persistence")
    if persistence:
        after = promises.get("losses_allowed_after") or []
        rows.append(("persistence", {"power": "acknowledged messages survive a power loss of the broker's storage",
                                     "kill": "acknowledged messages survive a kill -9 of the broker, not a power loss",
                                     "graceful": "acknowledged messages survive a graceful stop, not a kill",
                                     "none": "acknowledged messages survive no stop of the broker"}.get(
                                         persistence, persistence) + f" (persistence = {persistence})",
                     f"messages lost to a {' / '.join(after)} of the broker count as durability.lost_allowed, "
                     "not durability.lost" if after else "every lost acknowledged message is durability.lost"))
    policy, limit = promises.get("queue_policy"), promises.get("queue_limit")
    if policy == "none" or (policy and limit is None):
        rows.append(("queue limit", "none declared (queue_policy = none)",
                     "nothing is ever trimmed legally: every limits.* rule is not applicable and a missing "
                     "message is a loss"))
    elif policy:
        kept = {"drop_oldest": "the oldest are dropped", "drop_newest": "the newest are dropped",
                "reject": "new ones are refused"}.get(policy, policy)
        rows.append(("queue limit", f"{limit} messages per session; beyond it {kept} (queue_policy = {policy})",
                     f"a message trimmed at the limit is legally trimmed, not lost; the limits.* rules for "
                     f"{policy} apply"))
    ttl = promises.get("message_ttl_s")
    rows.append(("message TTL", f"{ttl} s" if ttl else "none declared",
                 "a message older than its TTL (or its MQTT 5 expiry) is no longer owed" if ttl
                 else "a message without an MQTT 5 expiry interval never expires"))
    logs = guarantees.get("logs") or {}
    if logs:
        patterns = logs.get("patterns") or []
        failing = sum(1 for p in patterns if p.get("verdict") == "fail")
        rows.append(("log preset", f"{logs.get('preset') or 'none'} ({len(patterns)} patterns, {failing} failing)",
                     "a node's log line matching a failing pattern fails logs.error_lines; a reported one is "
                     "counted in logs.reported_lines"))
    credentials, tls = guarantees.get("credentials"), guarantees.get("tls")
    if credentials is not None:
        rows.append(("credentials", "user name and password ([target.credentials])" if credentials else
                     "anonymous", "a CONNECT refused for its credentials stops the run before the workload "
                     "(verdict unknown), never a violation"))
    if tls is not None:
        rows.append(("TLS", "every MQTT connection over TLS ([target.tls])" if tls else "plain TCP",
                     "a TLS handshake that fails stops the run before the workload (verdict unknown)" if tls
                     else "none: the clients speak plain MQTT"))
    for key, words in (("clock_tolerance_ms", "clock tolerance"), ("pipeline_slack_ms", "pipeline slack")):
        if guarantees.get(key) is not None:
            rows.append((words, f"{guarantees[key]} ms", {
                "clock_tolerance_ms": "how far apart two clocks may be read: a delivery this late after its "
                                      "expiry is not yet expiry.delivered_expired",
                "pipeline_slack_ms": "how long an acknowledged message may still be in the broker's pipeline: "
                                     "a backlog settles only after it"}[key]))
    allowed = guarantees.get("allowed") or []
    rows.append(("allowed anomalies", ", ".join(allowed) if allowed else "none",
                 "each listed invariant's violations are counted but pass" if allowed
                 else "every violation fails the run"))
    return rows


# -- junit.xml and the terminal ---------------------------------------------------------------------------

def _judged(item: dict[str, Any]) -> str:
    """' — covers 120 acknowledged; [MQTT-x] statement', the part of a message every output adds."""
    parts = [f"covers {covers_words(item)}"] if covers_words(item) else []
    if statement_of(item):
        parts.append(statement_of(item))
    return "".join(f" — {part}" for part in parts)


def junit_xml(report: dict[str, Any]) -> str:
    """One test case per invariant: fail → <failure>, unknown → <error>, not applicable → <skipped>."""
    cases = []
    for item in report["invariants"]:
        texts = "\n".join(w["text"] for w in item.get("witnesses", []))
        classname, name = item["id"].split(".")[0], item["id"]
        if item["verdict"] == "fail":
            cases.append(Case(classname, name, "failure",
                              f"{item['count']} violation(s): {item['title']}{_judged(item)}", texts))
        elif item["verdict"] == "unknown":
            cases.append(Case(classname, name, "error", f"unknown: {item.get('reason')}{_judged(item)}", texts))
        elif item["verdict"] == "not_applicable":
            cases.append(Case(classname, name, "skipped", item.get("reason") or "not applicable"))
        elif item.get("count"):
            cases.append(Case(classname, name, text=f"{item['count']} reported ({item.get('reason') or ''})\n{texts}"))
        else:
            cases.append(Case(classname, name))
    return write_junit("ordeal.invariants", cases, report.get("environment", {}).get("check_seconds", 0))


def print_table(report: dict[str, Any], file=None) -> None:
    """The verdict table, each failing or unknown invariant's statement, the notes, then ``summary_lines``."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(file=file, width=140)
    table = Table(title=f"Ordeal invariants — {escape(report['run_dir'])}")
    for name in ("invariant", "verdict", "count", "covers", "note"):
        table.add_column(name)
    colours = {"pass": "green", "fail": "bold red", "unknown": "yellow", "not_applicable": "dim", "allowed": "blue"}
    for item in report["invariants"]:
        note = item.get("reason") or (item["witnesses"][0]["text"] if item.get("witnesses") else "")
        table.add_row(item["id"], f"[{colours[item['verdict']]}]{item['verdict']}[/]", str(item["count"]),
                      escape(covers_words(item)), escape((note or "")[:110]))
    console.print(table)
    for item in actionable(report):
        if statement_of(item):
            console.print(f"{item['id']}: {statement_of(item)}", markup=False, highlight=False, soft_wrap=True)
    for note in report.get("notes", []):
        console.print(f"[bold]note:[/] {escape(note)}")
    for line in summary_lines(report):
        console.print(line, markup=False, highlight=False, soft_wrap=True)  # one line each: scripts read them
