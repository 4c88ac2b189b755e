"""The smoke tier of the detection matrix, end to end: every smoke defect switched on in its scenario is
caught by its expected invariant, and the correct broker passes the same scenarios and seeds.  Real
Redis Cluster, Tansu, reference-broker nodes, paho clients and one Spark job for all checks (~4 min on
2 cores)."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest

from contracts.exit_codes import EXIT_PASS as EXIT_OK
from ordeal.selftest.judging import CAUGHT, PASSED
from ordeal.selftest.matrix import load_matrix
from ordeal.selftest.runner import run_selftest

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]


@pytest.mark.timeout(480)
def test_smoke_tier_catches_every_smoke_defect_and_the_correct_broker_passes():
    matrix = load_matrix()
    smoke = {e.defect: e for e in matrix.entries if e.tier == "smoke"}
    # under runs/ (Mosquitto-style targets drop root and need searchable parents); one directory per session
    out = Path("runs") / "test-selftest-smoke" / datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S")
    result = run_selftest(matrix, "smoke", out)

    document = json.loads((out / "selftest.json").read_text())
    by_defect = {r["defect"]: r for r in document["rows"] if r["role"] == "defect"}
    assert set(by_defect) == set(smoke)
    for defect, row in by_defect.items():
        assert row["outcome"] == CAUGHT, f"{defect} not caught: {row}"
        assert set(smoke[defect].expect) <= set(row["failed"])
        assert row["detection_s"] is not None and 0 <= row["detection_s"] <= row["run_s"]
    correct = [r for r in document["rows"] if r["role"] == "correct"]
    assert {r["scenario"] for r in correct} == {r["scenario"] for r in by_defect.values()}
    for row in correct:
        assert row["outcome"] == PASSED, f"correct broker failed {row['scenario']}: {row['failed']} {row['witness']}"
    assert result.exit_code == EXIT_OK and document["exit_code"] == EXIT_OK
    assert (out / "selftest.html").read_text().count("<tr style=") == len(document["rows"])
    assert 'failures="0"' in (out / "selftest-junit.xml").read_text()
