"""``ordeal replay RUN_DIR``: play a stored plan again on a fresh topology and compare the verdicts (the
options; the logic lives in ordeal/replay.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

import harness.model  # noqa: F401  (registers the stages into the scenario model)
from contracts.errors import UsageError
from contracts.scenario import load_scenario
from ordeal.commands.images import build_missing_images
from ordeal.commands.isolation import enter_isolation, isolation_option
from ordeal.commands.spark import spark_options


@click.command(name="replay")
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("runs"), show_default=True,
              help="Directory under which the new run directory is created.")
@spark_options
@click.option("--check/--no-check", default=True, show_default=True,
              help="Check the new run (--no-check: no verdicts, the agreement is unknown).")
@isolation_option
def replay(run_dir: str, out: Path, spark_master: str | None, check: bool, isolated: bool) -> None:
    """Play RUN_DIR's stored plan.json and scenario.toml again on a fresh topology (same clients, messages,
    subscriber actions and faults at the same offsets), check it, print both runs' verdicts side by side
    with the agreement, and exit with the new run's exit code (0 pass, 1 fail, 2 unknown).  RUN_DIR may be
    a run directory, a shrink result or an explore corpus entry."""
    from rich.console import Console

    from ordeal.commands.progress import RichReporter
    from ordeal.replay import comparison_lines, load_stored_run
    from ordeal.replay import replay as replay_run

    stored = load_stored_run(run_dir)
    build_missing_images(load_scenario(stored.scenario_path))  # a bad scenario is refused here, before the
    # namespace re-exec; on the containers provider its missing images are built here, in the host's network
    where = enter_isolation(isolated)  # after the input checks, before any thread starts
    console = Console(stderr=True)
    console.print(f"network: {where}")
    try:
        with RichReporter(console) as reporter:
            played, comparison = replay_run(stored, out, reporter=reporter, spark_master=spark_master,
                                            check=check)
    except ValueError as error:  # a scenario or plan this version cannot run, named with the stored run
        raise UsageError(f"{stored.directory}: {error}") from error
    click.echo(f"replay of {stored.directory}\nnew run:   {played.run_dir}")
    for line in comparison_lines(comparison):
        click.echo(line)
    sys.exit(played.exit_code)
