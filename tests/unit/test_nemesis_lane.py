"""One lane: a fault planned after another's end does not start while that one is still in force (its apply
or heal overran), so a late heal never ends the next fault too (redis-write-stall seed 101)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from faults.base import Check, Evidence, FaultContext
from faults.nemesis import Nemesis, schedule_from_slots


def _slot(fault_id: str, start_s: float, end_s: float) -> dict:
    return {"fault_id": fault_id, "kind": "client_flap", "target": "sub-1", "start_s": start_s, "end_s": end_s}


def _nemesis(slots: list[dict], player) -> tuple[Nemesis, list]:
    rows: list = []
    ctx = FaultContext(SimpleNamespace(redis_nodes=[], brokers=[]),
                       record=lambda kind, **columns: rows.append((kind, columns)))
    return Nemesis(schedule_from_slots(slots), ctx, client_player=player), rows


def test_a_fault_waits_for_the_previous_one_whose_apply_overran():
    release = threading.Event()
    calls: list[tuple[str, str]] = []

    def player(spec, stage):
        calls.append((spec.id, stage))
        if (spec.id, stage) == ("first", "apply"):
            release.wait(10)  # an apply stuck past its own slot and the next one's start
        return Evidence.of(Check("played", {}, True))

    nemesis, rows = _nemesis([_slot("first", 0.0, 0.1), _slot("second", 0.2, 0.3)], player)
    nemesis.start()
    time.sleep(0.6)  # past the second fault's planned start and end
    assert calls == [("first", "apply")], "the second fault started while the first was still in force"
    release.set()
    assert nemesis.join(5)
    assert calls == [("first", "apply"), ("first", "heal"), ("second", "apply"), ("second", "heal")]
    start = next(columns for kind, columns in rows if kind == "fault_start" and columns["fault_id"] == "second")
    assert start["detail"]["waited_for"] == ["first"] and start["detail"]["offset_s"] >= 0.6
    assert nemesis.outcomes == {"first": "healed", "second": "healed"}


def test_slots_that_overlap_by_plan_still_play_together():
    release = threading.Event()
    calls: list[tuple[str, str]] = []

    def player(spec, stage):
        calls.append((spec.id, stage))
        if (spec.id, stage) == ("first", "apply"):
            release.wait(10)
        return Evidence.of(Check("played", {}, True))

    nemesis, rows = _nemesis([_slot("first", 0.0, 0.5), _slot("second", 0.1, 0.3)], player)
    nemesis.start()
    deadline = time.monotonic() + 5
    while ("second", "heal") not in calls and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ("second", "heal") in calls and ("first", "heal") not in calls, calls
    release.set()
    assert nemesis.join(5)
    start = next(columns for kind, columns in rows if kind == "fault_start" and columns["fault_id"] == "second")
    assert "waited_for" not in start["detail"]


def test_heal_all_cuts_the_wait_for_a_stuck_predecessor_short_and_says_so():
    release = threading.Event()

    def player(spec, stage):
        if (spec.id, stage) == ("first", "apply"):
            release.wait(10)
        return Evidence.of(Check("played", {}, True))

    nemesis, rows = _nemesis([_slot("first", 0.0, 0.1), _slot("second", 0.2, 0.3)], player)
    nemesis.start()
    time.sleep(0.4)
    nemesis._cancel.set()  # what heal_all does first; the stuck apply is released after
    deadline = time.monotonic() + 5
    while nemesis.outcomes.get("second") != "cancelled" and time.monotonic() < deadline:
        time.sleep(0.02)
    release.set()
    assert nemesis.join(5)
    (error,) = [columns for kind, columns in rows if kind == "fault_error" and columns["fault_id"] == "second"]
    assert error["detail"]["stage"] == "start" and "waited for first" in error["detail"]["reason"]
    assert nemesis.outcomes["second"] == "cancelled"
