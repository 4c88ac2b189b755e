"""The self-test's outputs: selftest.json (``result_document``), the text table the command prints, the
Markdown tables docs/selftest.md is made from, and selftest-junit.xml."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from contracts.exit_codes import EXIT_FAIL, EXIT_PASS, EXIT_UNKNOWN
from ordeal.selftest.judging import (
    FINDING,
    MISSED,
    UNKNOWN,
    VIOLATION,
    SelftestResult,
    defect_summaries,
    false_alarm_figures,
)
from ordeal.selftest.matrix import Matrix, defect_catalog
from ordeal.tables import aligned

# selftest.json (docs/schemas/selftest.schema.json); ordeal merge refuses one it does not know (missing = 1)
SELFTEST_VERSION = 1


def result_document(result: SelftestResult, matrix: Matrix) -> dict[str, Any]:
    catalog = defect_catalog()
    return {
        "schema_version": SELFTEST_VERSION,
        "shard": result.shard,
        "tier": result.tier,
        "matrix": matrix.source,
        "exit_code": result.exit_code,
        "verdict": {EXIT_PASS: "pass", EXIT_FAIL: "fail", EXIT_UNKNOWN: "unknown"}[result.exit_code],
        "catalog_size": len(catalog),
        "uncovered": list(result.uncovered),
        "check_s": result.check_s,
        "total_s": result.total_s,
        "errors": result.errors,
        "false_alarms": false_alarm_figures(result.rows),
        "defects": [d | {"catalog_invariant": catalog[d["defect"]].invariant if d["defect"] in catalog else None}
                    for d in defect_summaries(result.rows)],
        "rows": [asdict(r) | {"expect": list(r.expect), "failed": list(r.failed), "unknown": list(r.unknown),
                              "catalog_invariant": catalog[r.defect].invariant if r.defect in catalog else None}
                 for r in result.rows],
    }


SUMMARY_COLUMNS = ("defect", "scenario", "must fail", "caught / seeds", "need", "outcome", "median detect s")


def summary_rows(document: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """One line per defect and scenario: the detection matrix as the README shows it."""
    return [(d["defect"], Path(d["scenario"]).stem, ", ".join(d["expect"]), f"{d['caught']}/{d['runs']}",
             str(d["need"]), d["outcome"], "-" if d["median_detection_s"] is None else f"{d['median_detection_s']:.2f}")
            for d in document.get("defects", [])]


def markdown(document: Mapping[str, Any]) -> str:
    """The matrix as Markdown tables: per defect, then per run (docs/selftest.md is generated from it)."""
    lines = []
    if document.get("defects"):
        lines += ["| " + " | ".join(SUMMARY_COLUMNS) + " |", "|" + "---|" * len(SUMMARY_COLUMNS)]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |" for cells in summary_rows(document)]
        lines.append("")
    lines += ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for cells in table_rows(document):
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    lines.append("")
    lines.append("| scenario (correct broker) | runs | with a violation | unknown |")
    lines.append("|---|---|---|---|")
    for scenario, f in document["false_alarms"].items():
        lines.append(f"| {scenario} | {f['runs']} | {f['violations']} | {f['unknown']} |")
    lines.append("")
    lines.append(f"Tier {document['tier']}, verdict **{document['verdict']}** (exit {document['exit_code']}); "
                 f"check {document['check_s']} s for all runs in one Spark job; total {document['total_s']} s.")
    return "\n".join(lines) + "\n"


def junit_xml(document: Mapping[str, Any]) -> str:
    """One test case per judged run (CI): missed / violation -> <failure>, unknown -> <error>, black-box
    findings -> a passing case whose system-out lists what failed.  Written by the one JUnit writer."""
    from spark_checkers.junit import Case
    from spark_checkers.junit import junit_xml as write_junit

    cases = []
    for r in document["rows"]:
        classname, name, time_s = f"selftest.{r['role']}", r["label"], r["run_s"] or 0
        text = r["witness"] or r["reason"] or ""
        if r["outcome"] == MISSED:
            cases.append(Case(classname, name, "failure", f"defect {r['defect']} not caught by "
                              f"{', '.join(r['expect'])}; failed: {', '.join(r['failed']) or 'nothing'}", text, time_s))
        elif r["outcome"] == VIOLATION:
            cases.append(Case(classname, name, "failure", f"correct broker violated {', '.join(r['failed'])}",
                              text, time_s))
        elif r["outcome"] == UNKNOWN:
            cases.append(Case(classname, name, "error", "unknown", text, time_s))
        elif r["outcome"] == FINDING:
            cases.append(Case(classname, name, text=f"failed: {', '.join(r['failed']) or 'nothing'}\n{text}",
                              time_s=time_s))
        else:
            cases.append(Case(classname, name, time_s=time_s))
    for uncovered in document.get("uncovered", []):
        cases.append(Case("selftest.defect", f"defect-{uncovered}", "error", "no matrix entry for this catalog defect"))
    return write_junit(f"ordeal.selftest.{document['tier']}", cases, document.get("total_s") or 0)


COLUMNS = ("role", "defect", "scenario", "seed", "expected", "outcome", "failed", "detect s", "run s")


def table_rows(document: Mapping[str, Any]) -> list[tuple[str, ...]]:
    rows = []
    for r in document["rows"]:
        rows.append((r["role"], r["defect"] or "-", Path(r["scenario"]).stem, str(r["seed"]),
                     ", ".join(r["expect"]) or "-", r["outcome"], ", ".join(r["failed"]) or "-",
                     "-" if r["detection_s"] is None else f"{r['detection_s']:.2f}",
                     "-" if r["run_s"] is None else f"{r['run_s']:.1f}"))
    return rows


def text_table(document: Mapping[str, Any]) -> str:
    lines = aligned(COLUMNS, table_rows(document))
    if document.get("defects"):
        lines += ["", *aligned(SUMMARY_COLUMNS, summary_rows(document))]
    figures = document["false_alarms"]
    runs = sum(f["runs"] for f in figures.values())
    bad = sum(f["violations"] for f in figures.values())
    lines.append("")
    lines.append(f"correct-broker runs: {runs}, with a violation: {bad}; check {document['check_s']} s, "
                 f"total {document['total_s']} s")
    if document["uncovered"]:
        lines.append(f"catalog defects without a matrix entry: {', '.join(document['uncovered'])}")
    for error in document["errors"]:
        lines.append(f"error: {error}")
    lines.append(f"selftest verdict: {document['verdict']} (exit {document['exit_code']})")
    return "\n".join(lines)
