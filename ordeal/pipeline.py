"""The one pipeline: plan -> run -> check -> report.

Every command that runs or checks (``ordeal run``, ``replay``, ``shrink``, ``explore``, ``selftest``,
``check``) goes through here, so there is one check-and-write path: the checker's reports (report.json,
junit.xml, report.html) and the check's outcome in summary.json are always written together.  The stages
below never call each other: ``harness`` stops once the history and summary.json are written
(harness/run.py), ``spark_checkers`` decides from a stored run, and this module joins them.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contracts.exit_codes import EXIT_PASS, EXIT_UNKNOWN
from contracts.versions import SUMMARY_VERSION, SchemaVersionError, read_json, write_json

if TYPE_CHECKING:  # the harness is imported where a run starts: `ordeal check` needs none of it (its start-up)
    from harness.run import Reporter, RunResult
    from properties.plan import Plan

SUMMARY = "summary.json"


def run(scenario_path: str | Path, seed: int, out: str | Path = "runs", *, reporter: Reporter | None = None,
        check: bool = True, spark_master: str | None = None, stop: threading.Event | None = None,
        plan: Plan | None = None, replay_command: str | None = None, print_table: bool = True,
        provider: str | None = None, keeper: Any = None) -> RunResult:
    """Plan and run one scenario (harness/run.py), then check it and write its reports (unless
    ``check=False``: summary.json says skipped and ``check_and_record`` adds the verdict later, several
    runs in one Spark session).  A run whose history is incomplete is never checked: it stays unknown."""
    from harness.run import RunResult, SilentReporter, run_scenario

    reporter = reporter or SilentReporter()
    result = run_scenario(scenario_path, seed, out, reporter=reporter, check=check, stop=stop, plan=plan,
                          replay_command=replay_command, provider=provider, keeper=keeper)
    if check and result.summary.get("history_complete"):
        reporter.phase("checking")
        [checked] = check_and_record([result.run_dir], spark_master=spark_master, print_tables=print_table)
        result = RunResult(run_dir=result.run_dir, exit_code=checked.exit_code, summary=checked.summary)
        if checked.failure:
            reporter.message(f"check failed, verdict unknown: {checked.failure}")
        reporter.message(f"seed {result.summary.get('seed')}  exit {result.exit_code}  run dir {result.run_dir}"
                         f"\nreplay: {result.summary.get('replay')}")
    return result


class Checked:
    """One run's check: its report (None when the checker failed), summary.json as recorded, exit code."""

    def __init__(self, run_dir: Path, report: dict[str, Any] | None, summary: dict[str, Any] | None,
                 exit_code: int, failure: str = ""):
        self.run_dir, self.report, self.summary, self.exit_code, self.failure = (
            run_dir, report, summary or {}, exit_code, failure)


def check_and_record(run_dirs: list[Path | str], *, spark_master: str | None = None, spark=None,
                     print_tables: bool = False) -> list[Checked]:
    """Check stored runs in one Spark job, write each one's reports and record the check in its summary.json
    (when the run has one: a run made by the harness).  Never raises for a checker failure: each run is then
    unknown, with the reason in its summary."""
    from spark_checkers.api import check_runs
    from spark_checkers.html import prepare as prepare_html
    from spark_checkers.reports import print_table, write_reports

    dirs = [Path(d) for d in run_dirs]
    # The report's plotting library and template load while this thread waits for the Spark server.
    preparing = threading.Thread(target=prepare_html, name="ordeal-report-prepare", daemon=True)
    preparing.start()
    began = time.monotonic()
    try:
        reports: list[dict[str, Any] | None] = list(check_runs(dirs, spark_master=spark_master, spark=spark))
        failure = ""
    except Exception as error:  # noqa: BLE001 - a broken checker makes the verdict unknown, never a crash
        reports, failure = [None] * len(dirs), f"the checker failed: {type(error).__name__}: {error}"
    each_s = (time.monotonic() - began) / max(len(dirs), 1)
    preparing.join()
    checked: list[Checked] = []
    for run_dir, report in zip(dirs, reports, strict=True):
        if report is not None:
            write_reports(run_dir, report)
            if print_tables:
                print_table(report)
        code = int(report["exit_code"]) if report is not None else None
        summary = None
        if (run_dir / SUMMARY).is_file():
            summary = record_check(run_dir, code, check_s=each_s, failure=failure)
            code = int(summary["exit_code"])
        checked.append(Checked(run_dir, report, summary, EXIT_UNKNOWN if code is None else code, failure))
    return checked


def combined_exit_code(run_exit: int, check_exit: int) -> int:
    """The run's verdict once checked: the checker's, except that a pass cannot hide a run-level unknown
    (a fault that could not be applied: the run did not test what it planned)."""
    if check_exit == EXIT_PASS and run_exit == EXIT_UNKNOWN:
        return EXIT_UNKNOWN
    return check_exit


def record_check(run_dir: Path | str, check_exit: int | None, *, check_s: float | None = None,
                 failure: str = "") -> dict[str, Any]:
    """Write a check's outcome into a run's summary.json.  ``check_exit`` None = the checker failed
    (``failure`` says how): the verdict is unknown.  Returns the updated summary; its ``exit_code`` is the
    run's verdict."""
    path = Path(run_dir) / SUMMARY
    try:
        summary = read_json(path)  # an unknown schema_version is refused (SchemaVersionError is a ValueError)
    except SchemaVersionError:
        raise
    except (OSError, ValueError) as error:
        raise ValueError(f"{path}: cannot record a check: no readable summary.json ({error})") from error
    summary.setdefault("schema_version", SUMMARY_VERSION)  # an unversioned summary has version 1's layout
    run_exit = int(summary.get("run_exit_code", summary.get("exit_code", EXIT_UNKNOWN)))
    summary["run_exit_code"] = run_exit  # before any check, so a re-check starts from the run again
    if check_exit is None:
        summary["check"] = failure or "the checker failed"
        summary["exit_code"] = EXIT_UNKNOWN
        summary["checked"] = False
    else:
        summary["check"] = {"exit_code": int(check_exit)}
        summary["exit_code"] = combined_exit_code(run_exit, int(check_exit))
        summary["checked"] = True
    if check_s is not None:
        summary.setdefault("timings_s", {})["check_s"] = round(check_s, 3)
    write_json(Path(run_dir) / SUMMARY, summary)
    return summary


def check_runs_later(run_dirs: list[Path | str], spark_master: str | None = None) -> list[int]:
    """Check runs made with ``check=False`` in one Spark session; returns each run's exit code.  A run whose
    history is incomplete is not checked (its summary already says unknown)."""
    dirs = [Path(d) for d in run_dirs]
    summaries = {d: read_json(d / SUMMARY) for d in dirs}
    checkable = [d for d in dirs if summaries[d].get("history_complete")]
    for item in check_and_record(checkable, spark_master=spark_master) if checkable else []:
        summaries[item.run_dir] = item.summary
    return [int(summaries[d]["exit_code"]) for d in dirs]
