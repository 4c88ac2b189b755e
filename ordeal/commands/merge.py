"""``ordeal merge DIR...``: put the outputs of a nightly's shards together (the options; the logic lives in
ordeal/merge.py), and ``--shard K/N``, the option ``ordeal explore`` and ``ordeal selftest`` take
(ordeal/shard.py says which seeds and runs a shard gets)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ordeal.shard import SHARD_FORM, WHOLE, Shard


def _parse_shard(ctx: click.Context, param: click.Parameter, value: str | None) -> Shard:
    return WHOLE if value is None else Shard.parse(value, option="--shard")  # ShardError: exit 3


shard_option = click.option(
    "--shard", "shard", default=None, metavar="K/N", callback=_parse_shard, expose_value=True,
    help=f"Run only shard K of N of the work ({SHARD_FORM}; default everything): explore's seeds s with "
         "s % N == K-1, the self-test's entries dealt over N shards; `ordeal merge` puts the N outputs together.")


@click.command(name="merge")
@click.argument("directories", nargs=-1, required=True, type=click.Path(path_type=Path), metavar="DIR...")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("runs/merged"),
              show_default=True, help="Where the merged selftest/, explore/, corpus/, junit/ and merge.json go.")
def merge(directories: tuple[Path, ...], out: Path) -> None:
    """Merge the shard outputs in DIR... (each the --out of `ordeal selftest --shard K/N` or `ordeal explore
    --shard K/N`, or a directory holding such outputs one level down) into one self-test table, one explore
    summary, one corpus and the JUnit files.  Exit 1 if any exploration failed a run, a defect was missed or
    the correct broker had a violation; else 2 if anything is unknown; else 0; 3 when the shards cannot be
    merged (not a shard output, an unknown schema version, different N, a missing or repeated shard)."""
    from ordeal.merge import merge as merge_shards

    result = merge_shards(directories, out)
    for line in result.lines:
        click.echo(line)
    sys.exit(result.exit_code)
