"""What ``ordeal run`` and ``ordeal check`` print last about a run, so that it always agrees with the files
the run left: a checked run's verdict block is its report's (spark_checkers/reports.py ``summary_lines``,
printed with the verdict table); this module adds only what report.json cannot say — a run that was never
checked (summary.json: why, its exit code, whether its history was recorded to the end), and an exit code the
run itself made unknown although its check passed (ordeal/pipeline.py ``combined_exit_code``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from contracts.exit_codes import EXIT_UNKNOWN


def closing_lines(summary: dict[str, Any], report: dict[str, Any] | None, exit_code: int) -> list[str]:
    """The lines after the run's counts: for an unchecked run its verdict and history (``unchecked_lines``);
    for a checked one nothing (its report's lines came with the table) unless the exit code is not the
    report's."""
    if report is None:
        return unchecked_lines(summary, exit_code)
    if exit_code != report["exit_code"]:
        why = summary.get("error") or (f"{summary.get('counts', {}).get('fault_errors')} fault(s) could not be "
                                       "applied or healed" if summary.get("counts", {}).get("fault_errors")
                                       else "the run itself was unknown")
        return [f"exit {exit_code}, not the check's {report['exit_code']}: {why} (a clean check does not make "
                "it a pass)"]
    return []


def unchecked_lines(summary: dict[str, Any], exit_code: int) -> list[str]:
    """A run with no report: 'verdict: unknown (exit 2): why' or 'verdict: not checked (exit N): ...', then
    whether the history was recorded to the end (its completeness in the checkers' sense — the drain ended
    quietly — only a check decides)."""
    check = summary.get("check") if isinstance(summary.get("check"), str) else "not checked"
    run_dir = summary.get("run_dir") or "RUN_DIR"
    if exit_code == EXIT_UNKNOWN:
        why = summary.get("error") or check
        lines = [f"verdict: unknown (exit {exit_code}): {why}" + ("" if why == check else f"; {check}")]
    else:
        lines = [f"verdict: not checked (exit {exit_code}): {check}; `ordeal check {run_dir}` decides"]
    manifest = summary.get("manifest") or {}
    if not summary.get("history_complete"):
        why = manifest.get("incomplete_reason") or summary.get("error") or "the recorder did not finish"
        lines.append(f"history complete: no ({why})")
    else:
        drain = (summary.get("drain") or {}).get("reason")
        lines.append(f"history complete: not judged (recorded to the end, the drain ended {drain!r}; only a "
                     "check decides)")
    return lines


def stored_report(run_dir: Path, summary: dict[str, Any]) -> dict[str, Any] | None:
    """The run's report.json when summary.json says its check was recorded, else None."""
    if not summary.get("checked"):
        return None
    try:
        return json.loads((Path(run_dir) / "report.json").read_text())
    except (OSError, ValueError):
        return None
