"""``ordeal selftest``: the defect detection matrix and the false-alarm budget (the options; the logic lives
in the ordeal/selftest/ package)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from contracts.errors import UsageError
from ordeal.commands.isolation import enter_isolation, isolation_option
from ordeal.commands.merge import shard_option
from ordeal.commands.spark import spark_options
from ordeal.shard import Shard


@click.command(name="selftest")
@click.option("--tier", type=click.Choice(["smoke", "full"]), default="smoke", show_default=True,
              help="smoke: the matrix's smoke entries (CI, one seed each); full: every catalog defect in a "
                   "shipped scenario over its seeds, the false-alarm repeats and the black-box runs.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("runs/selftest"),
              show_default=True, help="Directory for selftest.json, selftest.html and the run directories.")
@click.option("--matrix", "matrix_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The matrix file (default selftest/matrix.toml).")
@click.option("--repeat", type=click.IntRange(min=1), default=None,
              help="Correct-broker repeats per false-alarm scenario (full tier; default from the matrix).")
@click.option("--blackbox/--no-blackbox", default=None,
              help="Run the black-box scenarios (default: only in the full tier).")
@click.option("--defect", "defects", multiple=True,
              help="Only this defect's entry of the tier (its other entry if the tier has none; repeatable); "
                   "skips the false-alarm repeats.")
@click.option("--seed", "seeds", type=click.IntRange(min=0), multiple=True,
              help="Run the selected entries with these seeds instead of the matrix's (repeatable).")
@spark_options
@click.option("--rejudge", is_flag=True,
              help="Run nothing: judge OUT's stored runs again (their report.json) and rewrite its outputs.")
@click.option("--recheck", is_flag=True,
              help="With --rejudge: check OUT's stored runs again first (changed checkers), then judge.")
@shard_option
@isolation_option
def selftest(tier: str, out: Path, matrix_path: Path | None, repeat: int | None, blackbox: bool | None,
             defects: tuple[str, ...], seeds: tuple[int, ...], spark_master: str | None, rejudge: bool,
             recheck: bool, shard: Shard, isolated: bool) -> None:
    """Run the defect detection matrix: each catalog defect switched on in its scenario must be caught by
    its expected invariant, and the correct broker must pass the same scenarios.  Writes OUT/selftest.json
    and OUT/selftest.html.  Exit 0: all caught, no false alarm; 1: a defect missed or a correct run
    violated; 2: something unknown; 3: a usage error (bad matrix, option or --out)."""
    from ordeal.selftest.matrix import DEFAULT_MATRIX, load_matrix
    from ordeal.selftest.outputs import result_document, text_table
    from ordeal.selftest.runner import rejudge as rejudge_stored
    from ordeal.selftest.runner import run_selftest

    matrix = load_matrix(matrix_path or DEFAULT_MATRIX)
    if recheck and not rejudge:
        raise UsageError("--recheck goes with --rejudge (it checks OUT's stored runs again, then judges them)")
    if rejudge and not shard.whole:
        raise UsageError(f"--shard {shard} goes without --rejudge (a re-judged OUT keeps the shard it was run as)")
    if rejudge:
        if not (out / "selftest.json").is_file():
            raise UsageError(f"--rejudge: {out / 'selftest.json'} does not exist; run the self-test first")
        result = rejudge_stored(out, matrix, recheck=recheck, spark_master=spark_master,
                                log=lambda text: click.echo(text, err=True))
    else:
        # like run / explore: the runs' network faults (partitions, redis_outage: matrix scenarios) need the
        # private namespace; without it they are refused and every such run is unknown
        click.echo(f"network: {enter_isolation(isolated)}", err=True)
        result = run_selftest(matrix, tier, out, repeat=repeat, blackbox=blackbox, defects=defects,
                              seeds=seeds, spark_master=spark_master, log=lambda text: click.echo(text, err=True),
                              shard=shard)
    click.echo(text_table(result_document(result, matrix)))
    if result.shard and result.shard.get("n", 1) > 1:
        click.echo(f"shard {result.shard['k']}/{result.shard['n']}: {len(result.rows)} of "
                   f"{len(result.shard.get('planned', []))} planned runs; `ordeal merge` the N shard directories "
                   "for the tier's verdict")
    click.echo(f"wrote {out / 'selftest.json'} and {out / 'selftest.html'}")
    sys.exit(result.exit_code)
