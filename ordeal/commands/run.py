"""``ordeal run`` (a scenario end to end), ``ordeal plan`` (the plan a scenario and seed produce) and
``ordeal scenarios`` (the shipped scenarios)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

import harness.model  # noqa: F401  (registers the stages into the scenario model)
from contracts.exit_codes import EXIT_USAGE
from contracts.scenario import ScenarioError, default_scenarios_dir, find_scenario, load_scenario
from ordeal.commands.images import build_missing_images
from ordeal.commands.isolation import enter_isolation, isolation_option
from ordeal.commands.progress import RichReporter
from ordeal.commands.spark import spark_options
from ordeal.commands.summary import closing_lines, stored_report


@click.command(name="run")
@click.argument("scenario")
@click.option("--seed", type=int, default=1, show_default=True, help="The plan's seed (same seed, same plan).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("runs"), show_default=True,
              help="Directory under which the run directory is created.")
@click.option("--check/--no-check", default=True, show_default=True,
              help="Check the history with spark_checkers at the end (when available).")
@click.option("--provider", type=click.Choice(["local", "containers"]), default=None,
              help="Topology provider, overriding the scenario's [topology] provider (default: local).")
@spark_options
@isolation_option
def run(scenario: str, seed: int, out: Path, check: bool, spark_master: str | None, provider: str | None,
        isolated: bool) -> None:
    """Run SCENARIO (a name from scenarios/ or a .toml path) end to end and record its history."""
    from rich.console import Console

    from contracts.scenario import with_provider
    from ordeal import pipeline

    path = find_scenario(scenario)
    loaded = load_scenario(path)  # an invalid file must fail here, before a run directory exists
    if provider is not None:
        loaded = with_provider(loaded, provider)  # e.g. a fault the provider lacks: refused before anything
    build_missing_images(loaded)  # containers provider: images built on first use, in the host's network
    where = enter_isolation(isolated)
    console = Console(stderr=True)
    console.print(f"network: {where}")
    with RichReporter(console) as reporter:
        result = pipeline.run(path, seed, out, reporter=reporter, check=check, spark_master=spark_master,
                              provider=provider)
    counts = result.summary.get("counts", {})
    console.print(f"published {counts.get('published')}  acked {counts.get('acked')}  failed "
                  f"{counts.get('failed')}  indeterminate {counts.get('indeterminate')}  delivered "
                  f"{counts.get('delivered')} ({counts.get('delivered_unique')} unique)  drain "
                  f"{(result.summary.get('drain') or {}).get('reason')}")
    # The verdict, the failing and unknown invariants and the history's completeness: a checked run's from its
    # report.json (printed with the table), an unchecked one's from summary.json (ordeal/commands/summary.py).
    for line in closing_lines(result.summary, stored_report(result.run_dir, result.summary), result.exit_code):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    click.echo(str(result.run_dir))
    sys.exit(result.exit_code)


@click.command(name="plan")
@click.argument("scenario")
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--summary", "summary_only", is_flag=True, help="Print only the plan's counts.")
def plan(scenario: str, seed: int, summary_only: bool) -> None:
    """Print the plan SCENARIO and --seed produce (canonical JSON, byte-identical per input)."""
    from properties.generate import make_plan, plan_notes

    loaded = load_scenario(find_scenario(scenario))
    made = make_plan(loaded, seed)
    for note in plan_notes(loaded, made):
        click.echo(f"note: {note}", err=True)
    if summary_only:
        click.echo(json.dumps(made.summary(), indent=2, sort_keys=True))
    else:
        sys.stdout.write(made.to_json())


@click.command(name="scenarios")
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Scenario directory (default: the shipped scenarios/).")
def scenarios(directory: Path | None) -> None:
    """List the scenarios with their tier, target and description."""
    directory = directory or default_scenarios_dir()
    failed = False
    for path in sorted(directory.glob("*.toml")):
        try:
            s = load_scenario(path)
        except ScenarioError as error:
            click.echo(f"{path.stem:<24} INVALID  {error}")
            failed = True
            continue
        click.echo(f"{s.name:<24} {s.scenario.tier:<8} {s.target.kind:<9} {s.scenario.duration_s:>6.0f}s  "
                   f"{s.scenario.description}")
    if failed:
        sys.exit(EXIT_USAGE)  # a scenario that does not load (contracts/exit_codes.py)
