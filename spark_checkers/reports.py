"""report.json (the machine truth), junit.xml (CI), report.html (auditors) and the terminal table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

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
            report = json.loads(path.read_text())
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
    invariants = report["invariants"]
    suite = ET.Element("testsuite", name="ordeal.invariants", tests=str(len(invariants)),
                       failures=str(sum(1 for i in invariants if i["verdict"] == "fail")),
                       errors=str(sum(1 for i in invariants if i["verdict"] == "unknown")),
                       skipped=str(sum(1 for i in invariants if i["verdict"] == "not_applicable")),
                       time=str(report.get("environment", {}).get("check_seconds", 0)))
    for item in invariants:
        case = ET.SubElement(suite, "testcase", classname=item["id"].split(".")[0], name=item["id"])
        texts = "\n".join(w["text"] for w in item.get("witnesses", []))
        if item["verdict"] == "fail":
            node = ET.SubElement(case, "failure", message=f"{item['count']} violation(s): {item['title']}")
            node.text = texts
        elif item["verdict"] == "unknown":
            node = ET.SubElement(case, "error", message=f"unknown: {item.get('reason')}")
            node.text = texts
        elif item["verdict"] == "not_applicable":
            ET.SubElement(case, "skipped", message=item.get("reason") or "not applicable")
        elif item.get("count"):
            out = ET.SubElement(case, "system-out")
            out.text = f"{item['count']} reported ({item.get('reason') or ''})\n{texts}"
    suites = ET.Element("testsuites")
    suites.append(suite)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True)


def print_table(report: dict[str, Any], file=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(file=file, width=140)
    table = Table(title=f"Ordeal invariants — {report['run_dir']}")
    for name in ("invariant", "verdict", "count", "note"):
        table.add_column(name)
    colours = {"pass": "green", "fail": "bold red", "unknown": "yellow", "not_applicable": "dim", "allowed": "blue"}
    for item in report["invariants"]:
        note = item.get("reason") or (item["witnesses"][0]["text"] if item.get("witnesses") else "")
        table.add_row(item["id"], f"[{colours[item['verdict']]}]{item['verdict']}[/]", str(item["count"]),
                      (note or "")[:110])
    console.print(table)
    for note in report.get("notes", []):
        console.print(f"[bold]note:[/] {note}")
    console.print(f"overall: [bold]{report['verdict']}[/] (exit {report['exit_code']})")
