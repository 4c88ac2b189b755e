"""The one entry point, ``ordeal``.  Each sub-command lives in ordeal/commands/<name>.py and is loaded
only when used, so ``ordeal --help`` stays fast and a broken stage cannot take the others down.  Every
usage or load error exits 3 here, in one place."""

from __future__ import annotations

import importlib
import sys

import click

from contracts.errors import UsageError
from contracts.exit_codes import EXIT_USAGE, HELP

# command name -> (module under ordeal.commands, attribute); each command's help is its own docstring
COMMANDS: dict[str, tuple[str, str]] = {
    "up": ("up", "up"),
    "broker": ("broker", "broker"),
    "defects": ("broker", "defects"),
    "scenarios": ("run", "scenarios"),
    "new-scenario": ("new_scenario", "new_scenario"),
    "plan": ("run", "plan"),
    "run": ("run", "run"),
    "check": ("check", "check"),
    "report": ("check", "report"),
    "replay": ("replay", "replay"),
    "shrink": ("shrink", "shrink"),
    "explore": ("explore", "explore"),
    "images": ("images", "images"),
    "selftest": ("selftest", "selftest"),
    "scoreboard": ("scoreboard", "scoreboard"),
    "merge": ("merge", "merge"),
    "spark": ("spark", "spark"),
}


class LazyGroup(click.Group):
    def main(self, *args, **kwargs):  # noqa: ANN201 - click's signature
        """Every usage or load error exits 3 (contracts/exit_codes.py), never 1 (a violation) or 2 (unknown):
        click's own (a bad option, a missing argument) and every ``contracts.errors.UsageError`` (a scenario,
        plan, matrix or run directory that cannot be used), printed as ``Error: <message>``."""
        kwargs.pop("standalone_mode", None)
        try:
            result = super().main(*args, standalone_mode=False, **kwargs)
        except click.ClickException as error:
            error.show()
            sys.exit(EXIT_USAGE)
        except UsageError as error:
            click.echo(f"Error: {error}", err=True)
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
        module_name, attribute = COMMANDS[name]
        return getattr(importlib.import_module(f"ordeal.commands.{module_name}"), attribute)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]}, epilog=HELP)
@click.version_option(package_name="ordeal")
def main() -> None:
    """Ordeal: chaos and correctness verification for MQTT brokers with persistent sessions."""


if __name__ == "__main__":
    main()
