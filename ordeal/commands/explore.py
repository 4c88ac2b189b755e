"""`ordeal replay`, `ordeal shrink`, `ordeal explore` (loaded lazily by ordeal/cli.py).
The logic lives in ordeal/replay.py, ordeal/shrink.py and ordeal/explore.py; this module parses options."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import click

import harness.model  # noqa: F401  (registers the stages into the scenario model)
from contracts.scenario import ScenarioError, load_scenario
from ordeal.commands.run import enter_isolation, isolation_option
from ordeal.commands.spark import spark_options


class InputError(click.ClickException):
    """Bad input: exit 3 (contracts/exit_codes.py), never mistaken for a verdict (1) or unknown (2)."""

    exit_code = 3


def parse_duration(text: str, option: str = "--budget") -> float:
    """'90', '90s', '10m', '1h30m' -> seconds."""
    match = re.fullmatch(r"\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s?)?\s*", text)
    if not text.strip() or not match or not any(match.groups()):
        raise click.BadParameter(f"{text!r}: expected a duration like 90s, 10m, 1h30m or plain seconds",
                                 param_hint=option)
    hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
    total = hours * 3600 + minutes * 60 + seconds
    if total <= 0:
        raise click.BadParameter(f"{text!r}: must be more than zero", param_hint=option)
    return total


def _validate_scenario(path: Path) -> None:
    """A bad scenario file must be refused here, before the command re-runs itself in a namespace."""
    try:
        load_scenario(path)
    except ScenarioError as error:
        raise InputError(str(error)) from error


def _stored(run_dir: str):
    from ordeal.replay import StoredRunError, load_stored_run

    try:
        return load_stored_run(run_dir)
    except StoredRunError as error:
        raise InputError(str(error)) from error


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

    from ordeal.commands.run import RichReporter
    from ordeal.replay import comparison_lines
    from ordeal.replay import replay as replay_run

    stored = _stored(run_dir)
    _validate_scenario(stored.scenario_path)
    where = enter_isolation(isolated)  # after the input checks, before any thread starts
    console = Console(stderr=True)
    console.print(f"network: {where}")
    try:
        with RichReporter(console) as reporter:
            played, comparison = replay_run(stored, out, reporter=reporter, spark_master=spark_master,
                                            check=check)
    except (ScenarioError, ValueError) as error:
        raise InputError(f"{stored.directory}: {error}") from error
    click.echo(f"replay of {stored.directory}\nnew run:   {played.run_dir}")
    for line in comparison_lines(comparison):
        click.echo(line)
    sys.exit(played.exit_code)


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
                   "between runs; harness/keeper.py).")
@spark_options
@isolation_option
def shrink(run_dir: str, runs_rule: str, max_attempts: int, budget: str, invariants: tuple[str, ...], out: Path,
           batch: int, fresh_topology: bool, spark_master: str | None, isolated: bool) -> None:
    """Minimise RUN_DIR's failing plan (fewer faults, clients, offline periods, messages, a shorter workload)
    by re-running smaller candidates; write shrunk-plan.json and print its replay command.  Exit 0 when a
    reproducing plan was written (smaller or not), 2 when the original could not be used."""
    from ordeal.shrink import RunsRule, ShrinkError, ShrinkSettings
    from ordeal.shrink import shrink as shrink_run

    stored = _stored(run_dir)
    _validate_scenario(stored.scenario_path)
    try:
        settings = ShrinkSettings(runs=RunsRule.parse(runs_rule), max_attempts=max_attempts,
                                  budget_s=parse_duration(budget), target=frozenset(invariants),
                                  spark_master=spark_master, batch=batch, keep_topology=not fresh_topology)
    except ShrinkError as error:
        raise InputError(str(error)) from error
    click.echo(f"network: {enter_isolation(isolated)}", err=True)  # every candidate runs in this namespace
    try:
        shrink_run(stored, settings, out, log=lambda line: click.echo(line))
    except ShrinkError as error:
        raise InputError(str(error)) from error


@click.command(name="explore")
@click.argument("scenario", required=False)
@click.option("--budget", default="30m", show_default=True, help="Wall-time budget (90s, 30m, 2h).")
@click.option("--corpus", type=click.Path(file_okay=False, path_type=Path), default=Path("runs/corpus"),
              show_default=True, help="Where failing plans (and the explored/unknown logs) are kept.")
@click.option("--seed-start", type=int, default=None,
              help="First seed (default: one after the highest seed of this scenario in the corpus).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("runs"), show_default=True,
              help="Directory under which the run directories are created.")
@spark_options
@click.option("--serial-checks", is_flag=True, default=False,
              help="Check each seed before the next starts (default: the checks of finished seeds run in the "
                   "background, batched in one Spark job, while the next seed runs; docs/replay-shrink-explore.md).")
@click.option("--fresh-topology", is_flag=True, default=False,
              help="Start and stop a topology per seed (default: one topology for every seed, reset and verified "
                   "between seeds, a fresh one whenever a reset cannot be verified; harness/keeper.py).")
@click.option("--topology-spares", type=click.IntRange(0, 3), default=1, show_default=True,
              help="Kept topologies reset in the background while the next seed runs on another (0: reset in "
                   "line, before the next seed starts).")
@click.option("--promote", "promote_entry", type=click.Path(file_okay=False, path_type=Path), default=None,
              metavar="ENTRY", help="Instead of exploring: copy this corpus entry into the smoke tier's "
                                    "regression list (tests/data/regressions/).")
@click.option("--regressions", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="With --promote: the regression list directory (default tests/data/regressions/).")
@click.option("--expect", type=click.Choice(["fail", "pass"]), default="fail", show_default=True,
              help="With --promote: the smoke tier expects the replay to fail the same invariants (a planted "
                   "defect the suite must keep catching) or to pass (a fixed bug must stay fixed).")
@isolation_option
def explore(scenario: str | None, budget: str, corpus: Path, seed_start: int | None, out: Path,
            spark_master: str | None, serial_checks: bool, fresh_topology: bool, topology_spares: int, promote_entry: Path | None, regressions: Path | None,
            expect: str, isolated: bool) -> None:
    """Run new seeds of SCENARIO until --budget is spent; keep every failing run's plan in --corpus with its
    replay command and first witness; end with a summary table; exit 1 if any run failed, else 2 if any
    was unknown, else 0."""
    from ordeal.commands.run import _scenario_path
    from ordeal.explore import REGRESSIONS_DIR, ExploreError, ExploreSettings, promote, summary_lines
    from ordeal.explore import explore as explore_runs
    from properties.plan import PlanError

    if promote_entry is not None:
        try:
            target = promote(promote_entry, regressions or REGRESSIONS_DIR, expect=expect)
        except ExploreError as error:
            raise InputError(str(error)) from error
        where = ("the smoke tier replays it (tests/integration/test_explore_regressions.py); commit it"
                 if target.parent.resolve() == REGRESSIONS_DIR.resolve() else
                 "the smoke tier only reads tests/data/regressions/")
        click.echo(f"promoted {promote_entry} -> {target} (expect {expect}); {where}")
        return
    if scenario is None:
        raise click.UsageError("SCENARIO is required (or --promote ENTRY)")
    path = _scenario_path(scenario)
    settings = ExploreSettings(budget_s=parse_duration(budget), corpus=corpus, out=out, seed_start=seed_start,
                               spark_master=spark_master, overlap_checks=not serial_checks,
                               keep_topology=not fresh_topology, topology_spares=topology_spares)
    _validate_scenario(path)
    click.echo(f"network: {enter_isolation(isolated)}", err=True)  # every seed runs in this namespace
    try:
        result = explore_runs(path, settings, log=lambda line: click.echo(line))
    except (ScenarioError, ExploreError, PlanError) as error:
        raise InputError(str(error)) from error
    for line in summary_lines(result):
        click.echo(line)
    sys.exit(result.exit_code)
