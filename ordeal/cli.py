"""The one entry point, ``ordeal``.  Each sub-command lives in ordeal/commands/<name>.py and is loaded
only when used, so ``ordeal --help`` stays fast and a broken stage cannot take the others down."""

from __future__ import annotations

import importlib
import sys

import click

from contracts.exit_codes import EXIT_USAGE, HELP

# command name -> (module under ordeal.commands, attribute, one-line help)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "up": ("up", "up", "Start the local topology, print its endpoints; --check verifies health and exits."),
    "broker": ("broker", "broker", "Run one reference-broker node in the foreground."),
    "defects": ("broker", "defects", "List the reference broker's defect catalog."),
    "scenarios": ("run", "scenarios", "List the scenarios shipped in scenarios/."),
    "plan": ("run", "plan", "Print the plan a scenario and seed produce, without running it."),
    "run": ("run", "run", "Run a scenario end to end: plan, run, history, check, report."),
    "check": ("check", "check", "Re-check a stored run without re-running it."),
    "report": ("check", "report", "Re-render a stored run's reports."),
    "replay": ("explore", "replay", "Re-run a stored plan against a fresh topology and compare verdicts."),
    "shrink": ("explore", "shrink", "Minimise a failing run's plan."),
    "explore": ("explore", "explore", "Run new seeds of a scenario until a time budget is spent."),
    "images": ("images", "images", "Build (or reuse) the container images of the containers provider."),
    "selftest": ("selftest", "selftest", "Run the defect detection matrix and the false-alarm budget."),
    "spark": ("spark", "spark", "The shared local Spark Connect server the checks run on: status, start, stop."),
}


class LazyGroup(click.Group):
    def main(self, *args, **kwargs):  # noqa: ANN201 - click's signature
        """Every usage or load error (a ClickException: bad option, a scenario that does not load, a run
        directory that is not one) exits 3, never 1 (a violation) or 2 (unknown)."""
        kwargs.pop("standalone_mode", None)
        try:
            result = super().main(*args, standalone_mode=False, **kwargs)
        except click.ClickException as error:
            error.show()
            sys.exit(EXIT_USAGE)
        except click.exceptions.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(result if isinstance(result, int) else 0)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module_name, attribute, short_help = COMMANDS[name]
        try:
            module = importlib.import_module(f"ordeal.commands.{module_name}")
        except ModuleNotFoundError as error:
            if error.name != f"ordeal.commands.{module_name}":
                raise
            return _not_built(name, short_help)
        return getattr(module, attribute)


def _not_built(name: str, short_help: str) -> click.Command:
    @click.command(name=name, short_help=f"(not built yet) {short_help}",
                   context_settings={"ignore_unknown_options": True})
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def command(args: tuple[str, ...]) -> None:
        raise click.ClickException(f"'ordeal {name}' is not built yet in this version.")

    return command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]}, epilog=HELP)
@click.version_option(package_name="ordeal")
def main() -> None:
    """Ordeal: chaos and correctness verification for MQTT brokers with persistent sessions."""


if __name__ == "__main__":
    main()
