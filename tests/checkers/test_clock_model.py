"""The expiry rules under a moved clock (docs/clock-model.md): each rule's bound widened by the clock timeline of the
history's node_event rows, a planted anomaly beyond the widened bound and its near-miss twin within it, and the same
history without the clock row judged as before (the widening is what excuses the twin).  Every case in one Spark
batch, on synthetic histories (spark_checkers/synthetic.py: ``clock_fault`` writes the rows the nemesis writes)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest

from contracts.history_schema import Kind
from spark_checkers import synthetic as s
from spark_checkers.api import check_runs
from spark_checkers.html import render_html

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]  # one Spark batch; slow when the machine is loaded

RULES = ("expiry.dropped_early", "durability.lost", "expiry.delivered_expired", "expiry.remaining_not_reduced",
         "durability.expired_session_present")
S = 1_000_000

# sub-0 offline over slots 5..8 (0.1 s a slot), every message with a 60 s expiry; pub-0 #6 queued meanwhile.
QUEUED = s.Spec(pairs=2, messages=12, protocol=5, expiry_s=60, offline=(s.Offline(0, 5, 9),))
SHORT = s.Spec(pairs=2, messages=12, protocol=5, expiry_s=2)  # a 2 s expiry: pub-1 #12 delivered late
LONG = s.Spec(pairs=2, messages=12, protocol=5, expiry_s=60)


def t_invoke(rows, publisher, pub_seq):
    return s.publish_row(rows, Kind.PUBLISH_INVOKE, publisher, pub_seq)["t_mono_us"]


def jump(rows, delta_s, at, heal_t=None, node="broker-1"):
    """broker-1's clock jumps by ``delta_s`` at ``at`` (healed back to 0 at ``heal_t``; None: the jump stays)."""
    return s.clock_fault(rows, "c1", "clock_jump", node, [(at, float(delta_s), "apply")], heal_t=heal_t)


def dropped(rows, delta_s=None, at_slot=7):
    """pub-0 #6 never reaches sub-0 (queued while it was away); with ``delta_s``: broker-1's clock jumps by it at
    slot ``at_slot`` and back at slot 11, after the reconnect."""
    rows = s.drop_delivery(rows, "sub-0", "pub-0", 6)
    if delta_s is None:
        return rows
    return jump(rows, delta_s, s.slot_time(QUEUED, at_slot) + 10_000, heal_t=s.slot_time(QUEUED, 11) + 10_000)


def late(rows, after_deadline_us, delta_s=None):
    """pub-1 #12 (expiry 2 s) reaches sub-1 ``after_deadline_us`` after its deadline, remaining 0; with ``delta_s``:
    broker-1's clock jumps by it 0.5 s after that publish (and stays)."""
    t0 = t_invoke(rows, "pub-1", 12)
    rows = s.move_delivery(rows, "sub-1", "pub-1", 12, t0 + 2 * S + after_deadline_us)
    rows = s.set_delivery_field(rows, "sub-1", "pub-1", 12, remaining_expiry_s=0)
    return rows if delta_s is None else jump(rows, delta_s, t0 + S // 2)


def remaining(rows, value, delta_s=None):
    """pub-1 #5 (expiry 60 s) reaches sub-1 5 ms after its publish with ``value`` s remaining; with ``delta_s``:
    broker-1's clock jumps by it 1 ms after that publish (and stays)."""
    rows = s.set_delivery_field(rows, "sub-1", "pub-1", 5, remaining_expiry_s=value)
    return rows if delta_s is None else jump(rows, delta_s, t_invoke(rows, "pub-1", 5) + 1_000)


def session(offline_to_slot, delta_s=None):
    """(spec, mutation): sub-0's session (Session Expiry Interval 1 s) offline from slot 3 to ``offline_to_slot``,
    back with session present 1; with ``delta_s``: broker-1's clock jumps by it at slot 5, while sub-0 is away."""
    spec = replace(LONG, messages=24, offline=(s.Offline(0, 3, offline_to_slot),))

    def mutation(rows):
        rows = s.set_connect(rows, "sub-0", 0, session_expiry_s=1)
        return rows if delta_s is None else jump(rows, delta_s, s.slot_time(spec, 5))

    return spec, mutation


# name -> (spec, mutation, {invariant: count} among RULES (every other one 0), words its witness says)
CASES = {
    # --- expiry.dropped_early: a +120 s jump on the broker after #6 was stamped explains its 60 s expiry ending
    "jump_explains_the_drop": (QUEUED, lambda r: dropped(r, 120), {}, ()),
    "drop_without_a_clock_row": (QUEUED, dropped, {"expiry.dropped_early": 1}, ("expiry of 60 s",)),
    # a jump smaller than the time left does not explain it; an offset in force since before the publish moves
    # stamp and judgement alike (one broker): nothing
    "jump_too_small_for_the_drop": (QUEUED, lambda r: dropped(r, 10), {"expiry.dropped_early": 1},
                                    ("not even 10.000 s early", "broker-1's clock jumped +10.000 s")),
    "offset_before_the_publish": (QUEUED, lambda r: dropped(r, 120, at_slot=2), {"expiry.dropped_early": 1}, ()),
    # --- expiry.delivered_expired: a -1 s jump back lets the broker deliver up to 1 s after the deadline
    "jump_back_delivery_within": (SHORT, lambda r: late(r, S + 200_000 - 1_000, -1), {}, ()),
    "jump_back_delivery_beyond": (SHORT, lambda r: late(r, S + 200_000 + 1_000, -1), {"expiry.delivered_expired": 1},
                                  ("broker-1's clock jumped -1.000 s", "1.000 s a broker's clock may have been behind")),
    "late_delivery_without_a_clock_row": (SHORT, lambda r: late(r, S + 200_000 - 1_000), {"expiry.delivered_expired": 1},
                                          ()),
    # --- expiry.remaining_not_reduced: a -10 s jump back adds up to 10 s to the remaining interval
    "jump_back_remaining_within": (LONG, lambda r: remaining(r, 70, -10), {}, ()),
    "jump_back_remaining_beyond": (LONG, lambda r: remaining(r, 71, -10), {"expiry.remaining_not_reduced": 1},
                                   ("remaining expiry of 71 s", "broker-1's clock jumped -10.000 s")),
    "remaining_long_without_a_clock_row": (LONG, lambda r: remaining(r, 70), {"expiry.remaining_not_reduced": 1}, ()),
    # --- durability.expired_session_present: 1 s interval, 0.2 s tolerance, a -0.5 s jump back: 1.7 s
    "session_present_beyond_the_clock": (*session(21, -0.5), {"durability.expired_session_present": 1},
                                         ("1.800 s after its disconnect", "0.500 s a broker's clock may have been")),
    "session_present_within_the_clock": (*session(19, -0.5), {}, ()),
    "session_present_without_a_clock_row": (*session(19), {"durability.expired_session_present": 1}, ()),
}


@pytest.fixture(scope="module")
def reports(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("clock-model")
    runs = {}
    for name, (spec, mutation, _, _) in CASES.items():
        runs[name] = s.write_run(root / name, mutation(s.generate(spec)), spec)
    return dict(zip(runs, check_runs(list(runs.values()), spark=spark), strict=True))


def _items(report):
    return {i["id"]: i for i in report["invariants"]}


@pytest.mark.parametrize("name", list(CASES))
def test_each_widened_rule_counts_its_plant_once_and_no_near_miss(reports, name):
    expected, words = CASES[name][2], CASES[name][3]
    items = _items(reports[name])
    counts = {invariant: items[invariant]["count"] for invariant in RULES}
    assert counts == {invariant: expected.get(invariant, 0) for invariant in RULES}, [
        (i, items[i]["verdict"], items[i].get("reason"), [w["text"] for w in items[i]["witnesses"]])
        for i in RULES if items[i]["count"] or items[i]["verdict"] == "unknown"]
    for invariant in expected:
        assert items[invariant]["verdict"] == "fail"
        [witness] = items[invariant]["witnesses"]
        for phrase in words:
            assert phrase in witness["text"], witness["text"]
    assert {i: items[i]["verdict"] for i in RULES if i not in expected} == {
        i: "pass" for i in RULES if i not in expected}


def test_an_expiry_the_clock_explains_is_reported_as_such(reports):
    """The drop a +120 s jump explains is no loss, and expiry.dropped_early says what the clock did: the node, its
    jump and when; the same drop without the clock row has no such note."""
    item = _items(reports["jump_explains_the_drop"])["expiry.dropped_early"]
    clock = item["details"]["expired_by_clock"]
    assert clock["count"] == 1
    [shown] = clock["shown"]
    assert (shown["data"]["client"], shown["data"]["publisher"], shown["data"]["pub_seq"]) == ("sub-0", "pub-0", 6)
    assert shown["data"]["skew_early_us"] == 120 * S
    t_jump = (s.slot_time(QUEUED, 7) + 10_000) / 1e6
    for phrase in ("message 6 from pub-0", "expired early by up to 120.000 s",
                   f"broker-1's clock jumped +120.000 s at {t_jump:.3f} s", "not a loss"):
        assert phrase in shown["text"], shown["text"]
    assert "expired_by_clock" not in _items(reports["drop_without_a_clock_row"])["expiry.dropped_early"]["details"]
    assert reports["jump_explains_the_drop"]["counts"].get("expired_legally", 0) >= 1
    schema = json.loads((Path(__file__).parents[2] / "docs" / "schemas" / "report.schema.json").read_text())
    jsonschema.validate(reports["jump_explains_the_drop"], schema)
    page = render_html(reports["jump_explains_the_drop"])  # the auditor's page says it beside the verdict
    assert "1 never delivered, expired early by a clock that moved (not losses)" in page
    assert f"clock jumped +120.000 s at {t_jump:.3f} s" in page


def test_the_widened_witness_carries_the_bound(reports):
    [w] = _items(reports["jump_back_delivery_beyond"])["expiry.delivered_expired"]["witnesses"]
    assert w["data"]["skew_late_us"] == S
    [w] = _items(reports["session_present_beyond_the_clock"])["durability.expired_session_present"]["witnesses"]
    assert (w["data"]["skew_late_us"], w["data"]["node_disconnect"]) == (S // 2, "broker-1")
    # without a clock row the witness is as it always was: no clock keys
    [w] = _items(reports["late_delivery_without_a_clock_row"])["expiry.delivered_expired"]["witnesses"]
    assert "skew_late_us" not in w["data"]
