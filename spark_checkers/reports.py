"""report.json (the machine truth), junit.xml (CI), report.html (auditors) and the terminal table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from contracts.versions import read_json
from spark_checkers.junit import Case
from spark_checkers.junit import junit_xml as write_junit

REPORT_JSON, JUNIT_XML, REPORT_HTML = "report.json", "junit.xml", "report.html"


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


def junit_xml(report: dict[str, Any]) -> str:
    """One test case per invariant: fail → <failure>, unknown → <error>, not applicable → <skipped>."""
    cases = []
    for item in report["invariants"]:
        texts = "\n".join(w["text"] for w in item.get("witnesses", []))
        classname, name = item["id"].split(".")[0], item["id"]
        if item["verdict"] == "fail":
            cases.append(Case(classname, name, "failure", f"{item['count']} violation(s): {item['title']}", texts))
        elif item["verdict"] == "unknown":
            cases.append(Case(classname, name, "error", f"unknown: {item.get('reason')}", texts))
        elif item["verdict"] == "not_applicable":
            cases.append(Case(classname, name, "skipped", item.get("reason") or "not applicable"))
        elif item.get("count"):
            cases.append(Case(classname, name, text=f"{item['count']} reported ({item.get('reason') or ''})\n{texts}"))
        else:
            cases.append(Case(classname, name))
    return write_junit("ordeal.invariants", cases, report.get("environment", {}).get("check_seconds", 0))


def print_table(report: dict[str, Any], file=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(file=file, width=140)
    table = Table(title=f"Ordeal invariants — {report['run_dir']}")
    for name in ("invariant", "verdict", "count", "note"):
        table.add_column(name)
    colours = {"pass": "green", "fail": "bold red", "unknown": "yellow", "not_applicable": "dim"}
    for item in report["invariants"]:
        note = item.get("reason") or (item["witnesses"][0]["text"] if item.get("witnesses") else "")
        table.add_row(item["id"], f"[{colours[item['verdict']]}]{item['verdict']}[/]", str(item["count"]),
                      (note or "")[:110])
    console.print(table)
    console.print(f"overall: [bold]{report['verdict']}[/] (exit {report['exit_code']})")
