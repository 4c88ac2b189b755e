"""`ordeal run`, `ordeal plan`, `ordeal scenarios` (loaded lazily by ordeal/cli.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import click

import harness.model  # noqa: F401  (registers the stages into the scenario model)
from contracts.exit_codes import EXIT_USAGE
from contracts.scenario import ScenarioError, default_scenarios_dir, find_scenario, load_scenario
from harness import netns
from ordeal.commands.spark import spark_options


def _scenario_path(name_or_path: str) -> Path:
    try:
        return find_scenario(name_or_path)
    except ScenarioError as error:
        raise click.ClickException(str(error)) from error


ISOLATION_HELP = ("Run inside private network + PID namespaces (default when root): network faults are real "
                  "packet drops and a SIGKILL of ordeal leaves no process behind.  --no-isolated: on the host's "
                  "127.0.0.1; network faults are then refused (fault_error, verdict unknown).")


def isolation_option(command):
    """``--isolated/--no-isolated`` for every command that starts runs (run, replay, shrink, explore, selftest)."""
    return click.option("--isolated/--no-isolated", "isolated", default=True, show_default=True,
                        help=ISOLATION_HELP)(command)


def enter_isolation(isolated: bool) -> str:
    """Put this ``ordeal`` command's work in its own network + PID namespaces, like ``ordeal up --isolated``:
    the same command line runs again under ``unshare --net --pid --fork --kill-child --mount-proc``
    (harness/netns.py), in the same working directory (relative --out paths hold), and this process exits
    with its exit code (does not return).  Unlike an exec, this process stays as a thin parent because
    unshare blocks SIGTERM/SIGINT: the parent forwards them to the run, and it holds unshare with
    PR_SET_PDEATHSIG, so a SIGKILL of ``ordeal`` kills unshare, whose --kill-child kills the namespace's
    PID 1, and the kernel then every process in the namespace.
    Returns where the runs live, for the user: "private" inside the namespace, else why not (not root:
    said once on stderr).  Call it after the input was validated and before any thread starts."""
    if netns.finish_reexec() or netns.in_private_netns():
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # the namespace has only lo: Spark must bind it
        return "private"
    if not isolated:
        return "host (--no-isolated): network faults are refused"
    if not netns.is_root():
        click.echo(f"not isolated: {netns.refusal_message()}", err=True)
        return f"host (not root, uid {os.geteuid()}): network faults are refused"
    context = click.get_current_context()
    if context.info_name not in sys.argv[1:]:  # e.g. click's test runner: sys.argv is not this command
        raise click.ClickException(
            f"cannot re-run `ordeal {context.info_name}` isolated: sys.argv {sys.argv!r} is not its command "
            "line; pass --no-isolated, or run it as `ordeal ...` / `python -m ordeal.cli ...`")
    try:
        argv = netns.isolated_argv([sys.executable, "-m", "ordeal.cli", *sys.argv[1:]])
    except netns.IsolationUnavailable as error:
        raise click.ClickException(str(error)) from error
    sys.exit(_run_isolated(argv))


def _die_with_parent() -> None:
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() == 1:  # the parent already died before the prctl
        os._exit(1)


def _run_isolated(argv: list[str]) -> int:
    environment = {**os.environ, netns.MARKER: "reexec"}  # the child brings lo up (netns.finish_reexec)
    child = subprocess.Popen(argv, env=environment, preexec_fn=_die_with_parent)  # noqa: PLW1509

    def forward(signum: int, frame: object) -> None:
        # unshare itself blocks SIGTERM/SIGINT: hand them to its child, the run (PID 1 of the namespace).
        for task in Path(f"/proc/{child.pid}/task").glob("*/children"):
            for pid in task.read_text().split():
                os.kill(int(pid), signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, forward)
    while True:
        try:
            code = child.wait()
            break
        except InterruptedError:
            continue
    return code if code >= 0 else 128 - code


class RichReporter:
    """A rich progress bar: phase, elapsed of the planned time, sent / acked / delivered, faults active."""

    def __init__(self, console) -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = console
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), TimeElapsedColumn(),
            TextColumn("{task.fields[stats]}"), console=console, transient=False)
        self.task = None

    def __enter__(self) -> RichReporter:
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def phase(self, name: str, total_s: float | None = None) -> None:
        if self.task is not None:
            task = self.progress.tasks[self.task]
            self.progress.update(self.task, completed=task.total or 1, total=task.total or 1)
        self.task = self.progress.add_task(name, total=total_s, stats="")

    def tick(self, elapsed_s: float, counters: dict[str, int], faults_active: int) -> None:
        stats = (f"sent {counters['published']}  acked {counters['acked']}  failed {counters['failed']}  "
                 f"indet {counters['indeterminate']}  delivered {counters['delivered']}  "
                 f"faults active {faults_active}")
        self.progress.update(self.task, completed=elapsed_s, stats=stats)

    def message(self, text: str) -> None:
        self.progress.console.print(text)


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

    path = _scenario_path(scenario)
    try:
        loaded = load_scenario(path)  # an invalid file must fail here, before a run directory exists
        if provider is not None:
            with_provider(loaded, provider)  # e.g. a fault the provider lacks: refused before anything starts
    except ScenarioError as error:
        click.echo(f"Error: {error}", err=True)
        sys.exit(EXIT_USAGE)  # a load error (contracts/exit_codes.py)
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
                  f"{(result.summary.get('drain') or {}).get('reason')}  history complete "
                  f"{result.summary.get('history_complete')}")
    if result.summary.get("error"):
        console.print(f"[bold red]{result.summary['error']}[/]")
    if isinstance(result.summary.get("check"), str):
        console.print(f"check: {result.summary['check']}")
    click.echo(str(result.run_dir))
    sys.exit(result.exit_code)


@click.command(name="plan")
@click.argument("scenario")
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--summary", "summary_only", is_flag=True, help="Print only the plan's counts.")
def plan(scenario: str, seed: int, summary_only: bool) -> None:
    """Print the plan SCENARIO and --seed produce (canonical JSON, byte-identical per input)."""
    from properties.generate import make_plan, plan_notes

    try:
        loaded = load_scenario(_scenario_path(scenario))
        made = make_plan(loaded, seed)
    except ScenarioError as error:
        raise click.ClickException(str(error)) from error
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
