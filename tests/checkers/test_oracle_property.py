"""The independent oracle (oracle/) and the Spark checkers agree on a seeded batch of generated histories.

Hypothesis draws the runs (oracle/generate.py: a correct broker's history, then 0-3 random anomalies), all of
them are checked in ONE spark_checkers.api.check_runs call (a check per history would take an hour), and each is
judged by the oracle: verdict and count must match on every invariant the oracle covers.  A disagreement is
printed with the run's directory, the invariant, both answers and the items counted differently; which side is
wrong is then traced by hand (tests/data/oracle/ keeps the regression cases, test_oracle_regressions.py).

The batch: ``ORDEAL_ORACLE_BATCH`` histories (200 here; tox -e nightly runs more), drawn with the fixed seed
``ORDEAL_ORACLE_SEED`` (Hypothesis's database off): every run of this module checks the same batch.  Every
disagreement fails: a checker bug found this way is fixed with its regression case, never excused.
"""

from __future__ import annotations

import os
import time
from collections import Counter

import pytest

from oracle import judge
from oracle.compare import describe, disagreements
from oracle.generate import draw, write
from oracle.rules import RULES
from spark_checkers.api import check_runs

BATCH = int(os.environ.get("ORDEAL_ORACLE_BATCH", "200"))
SEED = int(os.environ.get("ORDEAL_ORACLE_SEED", "20261202"))

# One Spark batch of BATCH histories: about 1.5 min on 2 shared cores for 200 (see the printed timing).
pytestmark = [pytest.mark.spark, pytest.mark.timeout(max(900, BATCH * 5))]


@pytest.fixture(scope="module")
def batch(spark, tmp_path_factory):
    """(run directories, checker reports, what each run is) of the whole batch, checked once."""
    started = time.monotonic()
    drawn = draw(BATCH, SEED)
    assert len(drawn) == BATCH, f"Hypothesis drew only {len(drawn)} distinct runs of the {BATCH} asked for"
    root = tmp_path_factory.mktemp("oracle")
    dirs = [write(root / f"run{i:04d}", run) for i, run in enumerate(drawn)]
    written = time.monotonic()
    reports = check_runs(dirs, spark=spark)
    checked = time.monotonic()
    print(f"\noracle batch: {BATCH} histories (seed {SEED}) drawn and written in {written - started:.1f} s, "
          f"checked in one Spark batch in {checked - written:.1f} s, under {root}")
    return dirs, reports, drawn


def compare(batch, rules=None) -> list:
    dirs, reports, _ = batch
    found = []
    for run_dir, report in zip(dirs, reports, strict=True):
        found += disagreements(report, judge(run_dir, rules))
    return found


def test_the_oracle_and_the_checkers_agree_on_every_generated_history(batch):
    found = compare(batch)
    drawn = {str(d): run for d, run in zip(batch[0], batch[2], strict=True)}
    assert not found, f"{len(found)} disagreement(s):\n" + "\n".join(
        f"{describe(d)}\n  drawn: {drawn[d.run_dir].label()}" for d in found[:40])


def test_the_batch_makes_the_checkers_decide_something(batch):
    """A batch the checkers pass whole would compare nothing: the generated anomalies must make many invariants
    fail (and some unknown or allowed) somewhere in the batch."""
    _, reports, drawn = batch
    verdicts = Counter((i["id"], i["verdict"]) for r in reports for i in r["invariants"])
    failing = {i for i, v in verdicts if v == "fail"}
    assert len(failing) >= 15, f"only {sorted(failing)} failed anywhere in the batch"
    assert {v for _, v in verdicts} >= {"pass", "fail", "unknown", "allowed", "not_applicable"}
    assert sum(run.label() == "clean" for run in drawn) >= BATCH // 10, "too few clean runs in the batch"


def _out_of_order_ignoring_last(m):
    """order.out_of_order broken on purpose: the last first delivery of each stream is never looked at."""
    items = RULES["order.out_of_order"](m)
    last = {}
    for r in m.got.values():
        stream = (r.client, r.publisher, r.first.row.get("topic"), r.first.row.get("qos"))
        if stream not in last or r.first.seq > last[stream].first.seq:
            last[stream] = r
    skipped = {(r.client, r.publisher, r.pub_seq) for r in last.values()}
    return [item for item in items if item not in skipped]


def test_a_planted_disagreement_is_found(batch):
    """The comparison is not blind: an oracle whose out-of-order rule ignores each stream's last message
    disagrees with the checkers somewhere in the batch, on that invariant only."""
    real = {(d.run_dir, d.invariant) for d in compare(batch)}
    found = [d for d in compare(batch, {"order.out_of_order": _out_of_order_ignoring_last})
             if (d.run_dir, d.invariant) not in real]
    assert found, "a broken order.out_of_order went unnoticed on the whole batch"
    assert {d.invariant for d in found} == {"order.out_of_order"}, [describe(d) for d in found[:5]]
    assert all(d.oracle[1] < d.checker[1] for d in found)
