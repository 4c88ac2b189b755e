"""``ordeal shrink RUN_DIR``: minimise a failing run's plan (the options; the logic lives in
ordeal/shrink.py, the candidate plans in properties/)."""

from __future__ import annotations

from pathlib import Path

import click

import harness.model  # noqa: F401  (registers the stages into the scenario model)
from contracts.scenario import load_scenario
from ordeal.commands.durations import parse_duration
from ordeal.commands.images import build_missing_images
from ordeal.commands.isolation import enter_isolation, isolation_option
from ordeal.commands.spark import spark_options


@click.command(name="shrink")
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--runs", "runs_rule", default="1/1", show_default=True, metavar="K/N",
              help="Accept a smaller plan when it fails the same invariant(s) in K of N re-runs. 1/1 is fast; "
                   "use 2/3 or 3/3 for failures that need luck (faults, timing).")
@click.option("--max-attempts", type=click.IntRange(1, 10_000), default=40, show_default=True,
              help="At most this many candidate plans.")
@click.option("--budget", default="10m", show_default=True, help="Wall-time budget (90s, 10m, 1h).")
@click.option("--invariant", "invariants", multiple=True, metavar="ID",
              help="Shrink for this failing invariant only (repeatable; default: every invariant the run failed).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("runs"), show_default=True,
              help="Directory under which shrink-<run>-<time>/ is created.")
@click.option("--batch", type=click.IntRange(1, 100), default=4, show_default=True,
              help="Candidates run before one check (a round, checked in one Spark job); the first reproducing "
                   "candidate in order wins, as one by one.  1 = check each candidate alone.")
@click.option("--fresh-topology", is_flag=True, default=False,
              help="Start and stop a topology per candidate run (default: one topology, reset and verified "
                   "between runs; harness/local/keeper.py).")
@spark_options
@isolation_option
def shrink(run_dir: str, runs_rule: str, max_attempts: int, budget: str, invariants: tuple[str, ...], out: Path,
           batch: int, fresh_topology: bool, spark_master: str | None, isolated: bool) -> None:
    """Minimise RUN_DIR's failing plan (fewer faults, clients, offline periods, messages, a shorter workload)
    by re-running smaller candidates; write shrunk-plan.json and print its replay command.  Exit 0 when a
    reproducing plan was written (smaller or not), 2 when the original could not be used."""
    from ordeal.replay import load_stored_run
    from ordeal.shrink import RunsRule, ShrinkSettings
    from ordeal.shrink import shrink as shrink_run

    stored = load_stored_run(run_dir)
    build_missing_images(load_scenario(stored.scenario_path))  # a bad scenario is refused here, before the
    # namespace re-exec; on the containers provider its missing images are built here, in the host's network
    settings = ShrinkSettings(runs=RunsRule.parse(runs_rule), max_attempts=max_attempts,
                              budget_s=parse_duration(budget), target=frozenset(invariants),
                              spark_master=spark_master, batch=batch, keep_topology=not fresh_topology)
    click.echo(f"network: {enter_isolation(isolated)}", err=True)  # every candidate runs in this namespace
    shrink_run(stored, settings, out, log=lambda line: click.echo(line))
