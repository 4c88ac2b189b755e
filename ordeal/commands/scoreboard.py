"""``ordeal scoreboard PATH...``: the durability scoreboard from stored run reports (the options; the logic
lives in ordeal/scoreboard.py)."""

from __future__ import annotations

from pathlib import Path

import click


@click.command(name="scoreboard")
@click.argument("paths", metavar="PATH", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Also write scoreboard.json, scoreboard.md and scoreboard.html in this directory.")
def scoreboard(paths: tuple[Path, ...], out: Path | None) -> None:
    """Build the durability scoreboard from stored runs: for each broker and fault class, the runs and how
    many passed, had a violation, were allowed (found, but the target never promised to prevent it) or
    unknown, and the finding in words (the failing invariants with their summed counts, one run to look at
    and its replay command).  PATH is a run directory or a directory holding run directories (searched
    recursively).  It reads report.json and scenario.json; it runs and checks nothing.

    The scoreboard is a report, not a verdict: exit 0 when the table was built, whatever the runs found;
    3 for a usage error (no run under the paths, a report or scenario of an unknown schema version or
    that cannot be read: the file is named)."""
    from ordeal.scoreboard import build, text_table, write_outputs

    document = build(paths)
    click.echo(text_table(document))
    if out is not None:
        written = write_outputs(document, out)
        click.echo(f"wrote {', '.join(str(p) for p in written)}")
