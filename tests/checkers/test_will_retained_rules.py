"""The Will rules (spark_checkers/wills.py) on synthetic histories: each with a planted anomaly and its near-miss
twin, which must pass; a run without a Will has nothing to judge (not applicable, never a pass by default).
Pure Python over the small rows: no Spark (the catalog's Spark cases are tests/support/anomalies.py will_*)."""

from __future__ import annotations

import json

import pytest

from contracts.history_schema import Kind, will_payload, will_topic
from spark_checkers.wills import will_connections, will_violations

S = 1_000_000
TOL = 200_000
SLACK = 20_000
END = 100 * S  # the history's last time: every Will is due + slack by then


def connect(seq, t, client="sub-0", delay=None, connection=1, session_present=False):
    will = {"topic": will_topic(client), "qos": 1, "delay_s": delay, "payload": will_payload(client, connection)}
    return {"seq": seq, "t_mono_us": t, "kind": Kind.CONNECT, "client": client, "session_present": session_present,
            "detail": json.dumps({"why": "plan", "role": "subscriber", "will": will})}


def disconnect(seq, t, client="sub-0", abrupt=True):
    return {"seq": seq, "t_mono_us": t, "kind": Kind.DISCONNECT, "client": client, "abrupt": abrupt,
            "initiator": "harness" if abrupt else "client", "detail": "{}"}


def will_arrives(seq, t, client="sub-0", connection=1):
    return {"seq": seq, "t_mono_us": t, "kind": Kind.DELIVERY, "client": "watcher", "topic": will_topic(client),
            "qos": 1, "retain": False, "detail": json.dumps({"will": will_payload(client, connection)})}


def judge(rows):
    return will_violations(sorted(rows, key=lambda r: r["seq"]), TOL, SLACK, END)[0]


def test_an_abrupt_end_owes_the_will_missing_planted_and_near_miss():
    base = [connect(1, 1 * S), disconnect(2, 5 * S)]
    assert set(judge(base)) == {"will.missing"}
    assert judge([*base, will_arrives(3, 5 * S + 50_000)]) == {}  # near-miss: it arrives


def test_a_will_later_than_due_plus_slack_is_missing():
    late = [connect(1, 1 * S), disconnect(2, 5 * S), will_arrives(3, 5 * S + 21 * S + SLACK)]
    assert set(judge(late)) == {"will.missing"} and judge(late)["will.missing"][0]["late"]
    assert judge([connect(1, 1 * S), disconnect(2, 5 * S), will_arrives(3, 5 * S + 19 * S)]) == {}


def test_a_will_due_within_the_slack_of_the_history_end_is_not_judged():
    assert judge([connect(1, 1 * S), disconnect(2, END - SLACK + 1)]) == {}
    assert set(judge([connect(1, 1 * S), disconnect(2, END - SLACK)])) == {"will.missing"}
    found, judged = will_violations([connect(1, 1 * S, delay=3), disconnect(2, END - 1 * S)], TOL, SLACK, END)
    assert found == {} and judged["undecided"] == 1


def test_a_normal_disconnect_forbids_the_will_planted_and_near_miss():
    clean = [connect(1, 1 * S), disconnect(2, 5 * S, abrupt=False)]
    assert judge(clean) == {}  # near-miss: nothing arrives, nothing owed
    assert set(judge([*clean, will_arrives(3, 5 * S + 50_000)])) == {"will.after_normal_disconnect"}


def test_a_will_before_its_delay_is_early_planted_and_near_miss():
    rows = [connect(1, 1 * S, delay=3), disconnect(2, 5 * S)]
    assert set(judge([*rows, will_arrives(3, 6 * S)])) == {"will.early"}  # 2 s before it was due
    assert judge([*rows, will_arrives(3, 8 * S - TOL + 1)]) == {}  # within the clock tolerance of the due time
    assert set(judge([*rows, will_arrives(3, 8 * S - TOL - 1)])) == {"will.early"}


def test_a_session_resumed_within_the_delay_cancels_the_will():
    resumed = [connect(1, 1 * S, delay=3), disconnect(2, 5 * S), connect(3, 6 * S, delay=3, connection=2,
                                                                          session_present=True)]
    assert judge(resumed) == {}  # not owed
    assert set(judge([*resumed, will_arrives(4, 9 * S)])) == {"will.early"}  # sent although cancelled
    # near-miss: the reconnect begins a new session (session present 0): the old one ended, its Will is due then
    fresh = [connect(1, 1 * S, delay=3), disconnect(2, 5 * S), connect(3, 6 * S, delay=3, connection=2)]
    assert set(judge(fresh)) == {"will.missing"}
    assert judge([*fresh, will_arrives(4, 6 * S + 10_000)]) == {}


def test_a_reconnect_after_the_delay_does_not_cancel_it():
    rows = [connect(1, 1 * S, delay=1), disconnect(2, 5 * S), connect(3, 7 * S, connection=2, delay=1,
                                                                       session_present=True)]
    assert set(judge(rows)) == {"will.missing"}
    assert judge([*rows, will_arrives(4, 6 * S + 10_000)]) == {}



def _resumed_at(t_resume, will_at=None):
    """A 3 s Will Delay, the connection cut at 5 s (due at 8 s), the session resumed at ``t_resume``."""
    rows = [connect(1, 1 * S, delay=3), disconnect(2, 5 * S),
            connect(3, t_resume, delay=3, connection=2, session_present=True)]
    return rows + ([will_arrives(4, will_at)] if will_at is not None else [])


def test_a_resume_within_the_clock_tolerance_of_the_due_time_allows_either_outcome():
    """The session resumed 22 ms after the delay ran out, no Will: the broker may have seen the CONNECT before
    its due time (clocks differ by up to the tolerance; its sweep runs periodically).  Resumed 22 ms before, the
    Will at the due time: the broker may have seen it after.  Beyond the tolerance each side is judged again."""
    due = 8 * S
    found, judged = will_violations(_resumed_at(due + 22_000), TOL, SLACK, END)
    assert found == {} and judged["either"] == 1 and judged["owed"] == 0  # near miss: cancelled, legal
    assert judge(_resumed_at(due + 22_000, will_at=due + 22_000)) == {}  # published at the resume, legal too
    assert judge(_resumed_at(due - 22_000, will_at=due + 50_000)) == {}  # resumed just before, published at due
    assert judge(_resumed_at(due - 22_000)) == {}
    # planted: beyond the tolerance, after (owed, missing) and before (cancelled, so early)
    assert set(judge(_resumed_at(due + TOL + 1))) == {"will.missing"}
    assert set(judge(_resumed_at(due - TOL - 1, will_at=due + 50_000))) == {"will.early"}
    # planted: within the tolerance, but the Will well before it was due
    assert set(judge(_resumed_at(due + 22_000, will_at=due - TOL - 1))) == {"will.early"}

def test_a_will_while_the_connection_is_open_is_early():
    assert set(judge([connect(1, 1 * S), will_arrives(2, 2 * S)])) == {"will.early"}
    assert judge([connect(1, 1 * S)]) == {}


def test_a_will_names_its_connection():
    """The payload says which connection's Will arrived: the second connection's Will is no Will of the first."""
    rows = [connect(1, 1 * S), disconnect(2, 2 * S, abrupt=False), connect(3, 3 * S, connection=2),
            disconnect(4, 4 * S)]
    assert judge([*rows, will_arrives(5, 4 * S + 10_000, connection=2)]) == {}
    assert set(judge([*rows, will_arrives(5, 4 * S + 10_000, connection=1)])) == {
        "will.after_normal_disconnect", "will.missing"}


def test_a_connection_replaced_without_a_row_is_not_judged():
    rows = [connect(1, 1 * S), connect(2, 2 * S, connection=2), disconnect(3, 4 * S, abrupt=False)]
    assert [c.payload for c in will_connections(rows)] == [will_payload("sub-0", 2)]
    assert judge(rows) == {}


@pytest.mark.parametrize("initiator,abrupt,owed", [("harness", True, True), ("server", True, True),
                                                   ("server", False, True), ("client", False, False)])
def test_which_ends_owe_the_will(initiator, abrupt, owed):
    end = {**disconnect(2, 5 * S), "initiator": initiator, "abrupt": abrupt}
    assert ("will.missing" in judge([connect(1, 1 * S), end])) is owed


# -- retained.not_last (spark_checkers/retained.py) over the catalog's retained histories (tests/support/anomalies.py)


def retained(**kwargs):
    from support.anomalies import BASE, _retained

    from spark_checkers import synthetic as s
    from spark_checkers.retained import retained_violations

    rows = [{**r, "seq": i} for i, r in enumerate(_retained(s.generate(BASE), **kwargs), 1)]
    return retained_violations(rows, SLACK, rows[-1]["t_mono_us"])


def test_the_newest_retained_message_reaches_a_late_subscriber_planted_and_near_miss():
    found, judged = retained()
    assert found == {} and judged == {"retained_publishes": 2, "subscriptions": 1, "judged": 1, "undecided": 0}
    older, _ = retained(deliver=1)
    assert [w["why"] for w in older["retained.not_last"]] == ["older"]
    assert (older["retained.not_last"][0]["pub_seq"], older["retained.not_last"][0]["newest_pub_seq"]) == (1, 2)
    none, _ = retained(deliver=None)
    assert [w["why"] for w in none["retained.not_last"]] == ["none"]


def test_a_newer_retained_message_still_in_flight_at_the_subscribe_is_not_owed():
    found, judged = retained(deliver=1, subscribe_slot=5, subscribe_after_us=600)
    assert found == {} and judged["judged"] == 1


def test_a_subscription_before_any_retained_ack_has_nothing_to_judge():
    found, judged = retained(deliver=None, subscribe_slot=1)
    assert found == {} and judged["judged"] == 0 and judged["subscriptions"] == 1


def test_no_retained_publish_no_will_nothing_applicable():
    """A run without Wills or retained publishes: the rules are not applicable, not passed (timeline.inapplicable)."""
    from support.anomalies import BASE

    from spark_checkers import synthetic as s
    from spark_checkers.guarantees import Guarantees
    from spark_checkers.timeline import SMALL_KINDS, build_timeline

    rows = [{**r, "seq": i} for i, r in enumerate(s.generate(BASE), 1) if r["kind"] in SMALL_KINDS]
    timeline = build_timeline("r", rows, Guarantees())
    assert set(timeline.inapplicable) == {"will.missing", "will.after_normal_disconnect", "will.early",
                                          "retained.not_last",  # and no shared subscription either:
                                          "shared.lost", "shared.redelivered_after_ack", "shared.duplicates"}
