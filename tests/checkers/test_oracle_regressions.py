"""The disagreements between the oracle and the checkers that were traced to a checker bug, each kept as its
smallest history under tests/data/oracle/<case>/ (a run directory) with the right answer in its expected.json:
``{"why": ..., "expected": {invariant: [verdict, count]}, "fixed": the checker's bug and its fix,
"checker_xfail": reason while the checker is still wrong}``.

Both judges must give the right answer; a checker still wrong is a strict xfail naming its fix, so the test
turns red the day the checker is fixed and the mark must go."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oracle import judge
from spark_checkers.api import check_runs

pytestmark = pytest.mark.spark
CASES = Path(__file__).resolve().parents[1] / "data" / "oracle"


def _cases() -> list[Path]:
    return sorted(p for p in CASES.iterdir() if (p / "expected.json").is_file())


def _expected(case: Path) -> dict:
    return json.loads((case / "expected.json").read_text())


def _checker_params():
    for case in _cases():
        reason = _expected(case).get("checker_xfail")
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        yield pytest.param(case, id=case.name, marks=marks)


@pytest.fixture(scope="module")
def reports(spark) -> dict[str, dict]:
    cases = _cases()
    return {case.name: report for case, report in zip(cases, check_runs(cases, spark=spark), strict=True)}


def test_there_are_regression_cases():
    assert _cases(), f"no case under {CASES}"


@pytest.mark.parametrize("case", _cases(), ids=lambda p: p.name)
def test_the_oracle_gives_the_right_answer(case):
    verdicts = judge(case).verdicts
    found = {i: [verdicts[i].verdict, verdicts[i].count] for i in _expected(case)["expected"]}
    assert found == _expected(case)["expected"], {i: verdicts[i].items for i in found}


@pytest.mark.parametrize("case", _checker_params())
def test_the_checkers_give_the_right_answer(reports, case):
    by_id = {i["id"]: i for i in reports[case.name]["invariants"]}
    expected = _expected(case)["expected"]
    found = {i: [by_id[i]["verdict"], by_id[i]["count"]] for i in expected}
    assert found == expected, {i: [w.get("text") for w in by_id[i]["witnesses"]] for i in expected}
