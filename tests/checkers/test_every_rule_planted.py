"""Every invariant that can fail has a planted anomaly somewhere in the tests: in the synthetic catalogs (each
case names the invariants it must fail), or — for the few planted another way (a verdict "allowed", an unknown,
a real node that exits or stops answering) — in the test named here.  A new invariant without a plant fails
this test, so no rule lands that could pass for ever."""

from __future__ import annotations

from pathlib import Path

import test_delivery_rules as delivery
from support.anomalies import CASES

from contracts.invariants import INVARIANTS

TESTS = Path(__file__).parents[1]
# Planted outside the catalogs: invariant -> (test file, a phrase that test asserts).
ELSEWHERE = {
    "durability.lost_allowed": ("checkers/test_checkers_anomalies.py", 'gone["durability.lost_allowed"] == ("allowed", 6)'),
    "durability.session_lost_allowed": ("checkers/test_checkers_anomalies.py",
                                        'gone["durability.session_lost_allowed"] == ("allowed", 1)'),
    "logs.reported_lines": ("checkers/test_checkers_anomalies.py", 'skipped["logs.reported_lines"]["verdict"]'),
    "health.unplanned_exit": ("integration/test_target_death.py", "health.unplanned_exit"),
    "health.unresponsive": ("unit/test_health_unresponsive.py",
                            "def test_a_node_that_stops_answering_with_no_fault_planned_is_a_violation_named_in_words"),
    "meta.history_complete": ("unit/test_cli_report_agreement.py", 'by_id["drain timeout"]["meta.history_complete"]'),
    "meta.fault_bit": ("unit/test_cli_report_agreement.py", 'by_id["fault did not bite"]["meta.fault_bit"]'),
    "meta.checker_error": ("checkers/test_checker_errors.py", 'verdicts["meta.checker_error"]["reason"]'),
}


def _planted() -> set[str]:
    found: set[str] = set()
    for _spec, _mutate, expected in CASES.values():
        found |= set(expected)
    for case in delivery.CASES.values():
        found |= set(case[2])
    return found


def test_every_invariant_that_can_fail_has_a_planted_anomaly():
    planted = _planted()
    missing = [i.id for i in INVARIANTS if not i.reported_only and i.id not in planted and i.id not in ELSEWHERE]
    assert missing == [], f"invariants with no planted anomaly: {missing}"


def test_the_plants_named_elsewhere_are_there():
    for invariant, (path, phrase) in ELSEWHERE.items():
        assert phrase in (TESTS / path).read_text(), f"{invariant}: {path} no longer asserts {phrase!r}"
    assert not set(ELSEWHERE) & _planted(), "listed as planted elsewhere but now in a catalog: drop it from ELSEWHERE"
