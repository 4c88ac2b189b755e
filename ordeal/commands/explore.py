"""``ordeal explore SCENARIO``: run new seeds until a time budget is spent and keep every failure in a corpus;
``--promote ENTRY`` copies a corpus entry into the smoke tier's regression list (the options; the logic
lives in ordeal/explore.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

import harness.model  # noqa: F401  (registers the stages into the scenario model)
from contracts.scenario import find_scenario, load_scenario
from ordeal.commands.durations import parse_duration
from ordeal.commands.images import build_missing_images
from ordeal.commands.isolation import enter_isolation, isolation_option
from ordeal.commands.merge import shard_option
from ordeal.commands.spark import spark_options
from ordeal.shard import Shard


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
                   "between seeds, a fresh one whenever a reset cannot be verified; harness/local/keeper.py).")
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
@shard_option
@isolation_option
def explore(scenario: str | None, budget: str, corpus: Path, seed_start: int | None, out: Path,
            spark_master: str | None, serial_checks: bool, fresh_topology: bool, topology_spares: int, promote_entry: Path | None, regressions: Path | None,
            expect: str, shard: Shard, isolated: bool) -> None:
    """Run new seeds of SCENARIO until --budget is spent; keep every failing run's plan in --corpus with its
    replay command and first witness; end with a summary table; exit 1 if any run failed, else 2 if any
    was unknown, else 0."""
    from ordeal.explore import (
        REGRESSIONS_DIR,
        ExploreSettings,
        check_summary_shard,
        promote,
        summary_lines,
        write_summary,
    )
    from ordeal.explore import explore as explore_runs

    if promote_entry is not None:
        target = promote(promote_entry, regressions or REGRESSIONS_DIR, expect=expect)
        where = ("the smoke tier replays it (tests/integration/test_explore_regressions.py); commit it"
                 if target.parent.resolve() == REGRESSIONS_DIR.resolve() else
                 "the smoke tier only reads tests/data/regressions/")
        click.echo(f"promoted {promote_entry} -> {target} (expect {expect}); {where}")
        return
    if scenario is None:
        raise click.UsageError("SCENARIO is required (or --promote ENTRY)")
    path = find_scenario(scenario)
    settings = ExploreSettings(budget_s=parse_duration(budget), corpus=corpus, out=out, seed_start=seed_start,
                               spark_master=spark_master, overlap_checks=not serial_checks,
                               keep_topology=not fresh_topology, topology_spares=topology_spares, shard=shard)
    check_summary_shard(out, shard)  # one --out is one shard's output
    build_missing_images(load_scenario(path))  # a bad scenario is refused here, before the namespace re-exec;
    # on the containers provider its missing images are built here, in the host's network
    click.echo(f"network: {enter_isolation(isolated)}", err=True)  # every seed runs in this namespace
    result = explore_runs(path, settings, log=lambda line: click.echo(line))
    click.echo(f"wrote {write_summary(result, settings, path)}"
               + ("" if shard.whole else f" (shard {shard}; `ordeal merge` the N shard directories)"))
    for line in summary_lines(result):  # the verdict line last, as every command ends
        click.echo(line)
    sys.exit(result.exit_code)
