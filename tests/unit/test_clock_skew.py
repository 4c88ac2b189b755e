"""The clock model's bounds (spark_checkers/timeline.py, docs/clock-model.md): the clock timeline read from the
nemesis's node_event rows, ``clock_skew_us`` per clock fault kind (offset, jump, strobe, drift), the stretches the
runs table hands Spark (``clock_segments``) giving the same bounds, and the clock changes told in words."""

from __future__ import annotations

import json

import pytest

from faults import clock as clock_faults
from spark_checkers import synthetic as s
from spark_checkers.guarantees import Guarantees
from spark_checkers.timeline import (
    BROKER,
    CLOCK_ACTION,
    CLOCK_FAULT_KINDS,
    NEVER,
    REDIS,
    ClockRow,
    build_timeline,
    clock_changes,
    clock_segments,
    clock_skew_us,
    offset_range_us,
    segments_skew_us,
)

S = 1_000_000  # one second in µs


def event(seq: int, t: int, node: str, offset_s: float, reason: str = "apply", **detail) -> dict:
    return {"seq": seq, "t_mono_us": t, "kind": "node_event", "node": node,
            "detail": json.dumps({"action": "clock", "by": "nemesis", "offset_s": offset_s, "reason": reason,
                                  **detail})}


def timeline_of(rows: list[dict]):
    rows = [{"seq": 0, "t_mono_us": 0, "kind": "phase", "detail": json.dumps({"phase": "run_start"})}, *rows]
    return build_timeline("r", rows, Guarantees.from_scenario(s.Spec().scenario()))


def test_the_checker_reads_the_action_and_kinds_the_nemesis_writes():
    assert CLOCK_ACTION == clock_faults.CLOCK_ACTION
    assert CLOCK_FAULT_KINDS == clock_faults.CLOCK_KINDS


def test_the_timeline_is_collected_from_the_clock_rows_only():
    timeline = timeline_of([
        event(1, 1 * S, "broker-1", 30.0),
        {"seq": 2, "t_mono_us": 2 * S, "kind": "node_event", "node": "broker-1",
         "detail": json.dumps({"action": "restart"})},
        event(3, 3 * S, "broker-1", 0.0, "heal"),
        event(4, 4 * S, "redis-7001", -1.5),
    ])
    assert timeline.clock == {"broker-1": [ClockRow(1 * S, 30 * S, False), ClockRow(3 * S, 0, False)],
                              "redis-7001": [ClockRow(4 * S, -1_500_000, False)]}
    assert timeline.nodes_of(BROKER) == {"broker-1"} and timeline.nodes_of(REDIS) == {"redis-7001"}


def test_offset_before_and_after_a_node_row():
    rows = [ClockRow(10 * S, 30 * S, False)]
    assert offset_range_us(rows, 0, 5 * S) == (0, 0)  # before the first row: the harness's clock
    assert offset_range_us(rows, 0, 10 * S) == (0, 30 * S)  # the row at b is inside the window
    assert offset_range_us(rows, 10 * S, 20 * S) == (30 * S, 30 * S)  # in force at a
    assert clock_skew_us({}, ["broker-1"], ["broker-1"], 0, NEVER) == (0, 0)  # no rows: no skew


def test_a_constant_offset_shared_by_stamp_and_judge_moves_nothing_two_nodes_apart_do():
    clock = {"broker-1": [ClockRow(1 * S, 30 * S, False)]}
    assert clock_skew_us(clock, ["broker-1"], ["broker-1"], 2 * S, 9 * S) == (0, 0)
    # stamped on broker-2 (at 0), judged on broker-1 (30 s ahead): up to 30 s early; the other way, late
    assert clock_skew_us(clock, ["broker-2"], ["broker-1"], 2 * S, 9 * S) == (30 * S, 0)
    assert clock_skew_us(clock, ["broker-1"], ["broker-2"], 2 * S, 9 * S) == (0, 30 * S)
    # the offset applied inside the window: the same node stamps at 0 and judges at +30 s
    assert clock_skew_us(clock, ["broker-1"], ["broker-1"], 0, 9 * S) == (30 * S, 30 * S)


def test_a_jump_forward_is_early_a_jump_back_is_late():
    forward = {"broker-1": [ClockRow(5 * S, 120 * S, False)]}
    assert clock_skew_us(forward, ["broker-1"], ["broker-1"], 1 * S, 9 * S) == (120 * S, 120 * S)
    assert clock_skew_us(forward, ["broker-1"], ["broker-1"], 1 * S, 4 * S) == (0, 0)  # the window ends before it
    # a node's own change judged against itself, one stamp before, the judgement after: the bound is the spread
    assert segments_skew_us(clock_segments(forward), BROKER, 1 * S, 9 * S) == 120 * S
    # an instant jump back by 10 s (no heal): a deadline may be judged up to 10 s late
    back = {"broker-1": [ClockRow(5 * S, -10 * S, False)]}
    early, late = clock_skew_us(back, ["broker-1"], ["broker-1"], 1 * S, 9 * S)
    assert late == 10 * S


def test_a_strobe_spreads_by_its_two_offsets_within_its_slot():
    strobe = {"redis-7001": [ClockRow(2 * S, 0, False), ClockRow(3 * S, 30 * S, False), ClockRow(4 * S, 0, False),
                             ClockRow(5 * S, 30 * S, False), ClockRow(6 * S, 0, False)]}
    assert clock_skew_us(strobe, ["redis-7001"], ["redis-7001"], 2_500_000, 3_500_000) == (30 * S, 30 * S)
    assert clock_skew_us(strobe, ["redis-7001"], ["redis-7001"], 6 * S, 9 * S) == (0, 0)  # healed
    assert clock_skew_us(strobe, ["redis-7001"], ["redis-7001"], 3_100_000, 3_900_000) == (0, 0)  # one phase


def test_a_drift_reaches_its_next_row_linearly():
    # +0.1 s/s from 2 s; rows once a second; the heal row says where it had got to (reached_s) before it set 0
    timeline = timeline_of([
        event(1, 2 * S, "broker-1", 0.0, rate_ppm=100_000.0),
        event(2, 3 * S, "broker-1", 0.1, "drift"),
        event(3, 4 * S, "broker-1", 0.2, "drift"),
        event(4, 4_500_000, "broker-1", 0.0, "heal", reached_s=0.25),
    ])
    rows = timeline.clock["broker-1"]
    assert [r.drifting for r in rows] == [True, True, True, False, False]
    assert rows[3] == ClockRow(4_500_000, 250_000, False)  # the offset the drift reached before the heal
    # a window inside one second of the drift: the row in force at b drifts, so the next row counts
    assert offset_range_us(rows, 2_200_000, 2_800_000) == (0, 100_000)
    assert timeline.clock_skew_us(["broker-1"], ["broker-1"], 2_200_000, 2_800_000) == (100_000, 100_000)
    assert timeline.clock_skew_us(["broker-1"], ["broker-1"], 2 * S, 4_400_000) == (250_000, 250_000)


def test_a_drift_that_never_healed_runs_on_to_the_end_of_the_history():
    timeline = timeline_of([event(1, 2 * S, "broker-1", 0.0, rate_ppm=100_000.0),
                            {"seq": 2, "t_mono_us": 12 * S, "kind": "phase", "detail": json.dumps({"phase": "x"})}])
    assert timeline.clock["broker-1"][-1] == ClockRow(12 * S, 1 * S, False)  # 10 s at 0.1 s/s
    assert timeline.clock_skew_us(["broker-1"], ["broker-1"], 3 * S, 5 * S) == (1 * S, 1 * S)


CASES = {  # name -> clock rows per node (each a list of ClockRow)
    "offset": {"broker-1": [ClockRow(2 * S, 30 * S, False), ClockRow(6 * S, 0, False)]},
    "jump_two_brokers": {"broker-1": [ClockRow(3 * S, 120 * S, False)], "broker-2": [ClockRow(5 * S, -5 * S, False)]},
    "strobe": {"redis-7001": [ClockRow(t * S, (t % 2) * 30 * S, False) for t in range(2, 9)]},
    "drift": {"broker-1": [ClockRow(t * S, (t - 2) * 100_000, True) for t in range(2, 8)] + [ClockRow(8 * S, 0, False)]},
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_stretches_spark_reads_give_the_bounds_of_the_timeline(name):
    """For every window, the spread of a role's nodes from ``clock_segments`` (what job/clock.py computes per
    row) equals ``clock_skew_us`` with that role's nodes (and the named ones at 0) on both sides."""
    clock = CASES[name]
    known = {"broker-1", "broker-2", "broker-3", "redis-7001", "redis-7002", "kafka"}
    segments = clock_segments(clock, known)
    times = sorted({r.t_mono_us for rows in clock.values() for r in rows} | {0, NEVER})
    probes = sorted({t + d for t in times for d in (-1, 0, 1) if 0 <= t + d <= NEVER})
    for role in (BROKER, REDIS):
        nodes = {n for n in known | set(clock) if n.startswith(role)}
        for i, a in enumerate(probes[:-1]):  # a window starts at a time, never at NEVER
            for b in probes[i:]:
                early, late = clock_skew_us(clock, nodes, nodes, a, b)
                assert segments_skew_us(segments, role, a, b) == early == late, (role, a, b)


def test_no_clock_rows_no_stretches():
    """A run without clock faults hands Spark an empty array: every skew column is 0."""
    assert clock_segments({}, {"broker-1", "redis-7001"}) == []
    assert timeline_of([]).clock_segments() == []


def test_the_changes_are_told_with_the_node_the_jump_and_when():
    timeline = timeline_of([event(1, 3_200_000, "broker-1", 120.0), event(2, 9 * S, "broker-1", 0.0, "heal")])
    assert clock_changes(timeline, None, 1 * S, 5 * S) == "broker-1's clock jumped +120.000 s at 3.200 s (to +120.000 s)"
    assert clock_changes(timeline, None, 4 * S, 5 * S) == "broker-1's clock was +120.000 s off from before 4.000 s"
    assert clock_changes(timeline, ["broker-2"], 1 * S, 5 * S) == ""
    drift = timeline_of([event(1, 2 * S, "broker-1", 0.0, rate_ppm=100_000.0), event(2, 3 * S, "broker-1", 0.1, "drift"),
                         event(3, 4 * S, "broker-1", 0.2, "drift"), event(4, 5 * S, "broker-1", 0.0, "heal")])
    assert clock_changes(drift, None, 1 * S, 4 * S) == (
        "broker-1's clock drifted from +0.000 s to +0.200 s between 2.000 s and 4.000 s")
