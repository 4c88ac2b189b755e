"""`ordeal check RUN_DIR` (re-check a stored run) and `ordeal report RUN_DIR` (re-render its reports)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from contracts.errors import UsageError
from ordeal.commands.spark import spark_options
from ordeal.commands.summary import closing_lines


def _run_dir(path: str) -> Path:
    run_dir = Path(path)
    if not run_dir.is_dir():
        raise UsageError(f"{run_dir}: not a directory; expected a run directory holding history/ and "
                                   "scenario.json (runs/<scenario>-<seed>-<timestamp>/)")
    return run_dir


@click.command(name="check")
@click.argument("run_dir")
@spark_options
def check(run_dir: str, spark_master: str | None) -> None:
    """Re-check a stored run: write report.json, junit.xml and report.html, print the verdict table and exit
    0 (every invariant holds), 1 (a violation), 2 (unknown: the checkers could not decide) or 3 (RUN_DIR is
    not a run directory).

    RUN_DIR is a local path or a file:// URI (the checker reads the manifest and writes the reports itself;
    on a cluster, put runs on a mount every executor sees at the same path)."""
    from ordeal import pipeline
    from spark_checkers.loader import local_run_dir

    try:
        local = _run_dir(str(local_run_dir(run_dir)))
    except ValueError as error:
        raise UsageError(str(error)) from error  # exit 3: nothing was checked
    # The pipeline's one check-and-write path: the reports, and the check recorded in summary.json when the
    # run has one.  A crashed checker decides nothing: unknown (2), never pass or fail.
    [checked] = pipeline.check_and_record([local], spark_master=spark_master, print_tables=True)
    if checked.failure:
        click.echo(f"Error: {checked.failure}, verdict unknown", err=True)
        sys.exit(checked.exit_code)
    code = checked.exit_code
    for line in closing_lines(checked.summary, checked.report, code):  # the table ended with the report's lines
        click.echo(line)
    click.echo(f"reports: {local / 'report.html'}  {local / 'report.json'}  {local / 'junit.xml'}")
    sys.exit(code)


@click.command(name="report")
@click.argument("run_dir", type=click.Path(file_okay=False))
def report(run_dir: str) -> None:
    """Re-render junit.xml and report.html from a run's report.json (no Spark), print the verdict table, and
    exit with the stored exit code."""
    from spark_checkers.reports import print_table, render_from_report

    try:
        stored = render_from_report(_run_dir(run_dir))
    except (FileNotFoundError, ValueError) as error:
        raise UsageError(str(error)) from error
    print_table(stored)
    sys.exit(int(stored.get("exit_code", 2)))
