"""`ordeal check RUN_DIR` (re-check a stored run) and `ordeal report RUN_DIR` (re-render its reports)."""

from __future__ import annotations

import sys
from pathlib import Path

import click


def _run_dir(path: str) -> Path:
    run_dir = Path(path)
    if not run_dir.is_dir():
        raise click.ClickException(f"{run_dir}: not a directory; expected a run directory holding history/ and "
                                   "scenario.json (runs/<scenario>-<seed>-<timestamp>/)")
    return run_dir


@click.command(name="check")
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--spark-master", default=None, metavar="URL",
              help="Spark master (default: $ORDEAL_SPARK_MASTER or local[2]), e.g. spark://host:7077.")
def check(run_dir: str, spark_master: str | None) -> None:
    """Re-check a stored run: write report.json, junit.xml and report.html, print the verdict table and exit
    0 (every invariant holds), 1 (a violation) or 2 (unknown: the checkers could not decide)."""
    from spark_checkers.api import check_run

    code = check_run(_run_dir(run_dir), spark_master)
    click.echo(f"reports: {Path(run_dir) / 'report.html'}  {Path(run_dir) / 'report.json'}  "
               f"{Path(run_dir) / 'junit.xml'}")
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
        raise click.ClickException(str(error)) from error
    print_table(stored)
    sys.exit(int(stored.get("exit_code", 2)))
