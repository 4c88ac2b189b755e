"""The context rows of a witness (spark_checkers/context.py), without Spark: the window a witness names, and
the rows assembled around it from the timeline and the deliveries the Spark query found."""

from __future__ import annotations

from contracts.history_schema import Kind
from spark_checkers import context
from spark_checkers import synthetic as s
from spark_checkers.guarantees import Guarantees
from spark_checkers.timeline import NEVER, build_timeline

SPEC = s.Spec(pairs=1, messages=12, offline=(s.Offline(0, 5, 8),), faults=(s.Fault("f1", "kill", "redis-7003", 6, 9),))


def _timeline():
    rows = [{**r, "seq": i} for i, r in enumerate(s.generate(SPEC))]
    return rows, build_timeline("r", rows, Guarantees.from_scenario(SPEC.scenario()))


def test_the_window_spans_the_witness_times_and_names_its_message():
    w = {"client": "sub-0", "publisher": "pub-0", "pub_seq": 6, "t": 5_000, "prev_t": 2_000, "t_reconnect": NEVER,
         "t_origin": 0, "across_wrap": True}
    assert context.window_of(w) == context.Window("sub-0", 2_000, 5_000, "pub-0", 6)
    assert context.window_of({"client": "sub-0", "first_seq": 4, "t_invoke": 7}).pub_seq == 4
    assert context.window_of({"fault_id": "f1", "t": 5}) is None  # no subscriber: no context
    assert context.window_of({"client": "sub-0"}) is None


def test_rows_are_the_connects_deliveries_acks_and_faults_in_history_order():
    rows, timeline = _timeline()
    reconnect = next(r for r in rows if r["kind"] == Kind.CONNECT and r.get("session_present") is True)
    delivered = [r for r in rows if r.get("client") == "sub-0" and r["kind"] in (Kind.DELIVERY, Kind.DELIVERY_ACK_SENT)
                 and abs(r["t_mono_us"] - reconnect["t_mono_us"]) < 150_000]
    window = context.Window("sub-0", reconnect["t_mono_us"], reconnect["t_mono_us"] + 100_000, "pub-0", 5)
    out = context.assemble(window, delivered, timeline)
    kinds = [r["kind"] for r in out]
    assert kinds.count("connect") == 2  # the one the window starts in, and the reconnect in it
    resumed = [r for r in out if r["kind"] == "connect"][-1]
    assert (resumed["clean_start"], resumed["session_present"], resumed["seq"]) == (False, True, reconnect["seq"])
    assert "disconnect" in kinds and "fault_start" in kinds  # f1 starts at slot 6, inside the window's margin
    own = [r for r in out if r["witness"]]
    assert [r["message"] for r in own] == ["pub-0#5"] and own[0]["packet_id"] is not None and own[0]["dup"] is False
    assert any(r["kind"] == "ack" and r["message"] is None and r["dup"] is None for r in out)
    assert [r["t_s"] for r in out] == sorted(r["t_s"] for r in out)
    assert all(set(r) == set(out[0]) for r in out)  # one shape: the schema's keys, null where a kind has none


def test_a_fault_running_before_the_window_is_shown_as_active():
    _, timeline = _timeline()
    fault = timeline.faults[0]
    start = fault.t_start + context.MARGIN_US + 10_000  # the fault began before the window's margin
    out = context.assemble(context.Window("sub-0", start, start, None, None), [], timeline)
    assert fault.t_heal is not None and fault.t_heal > start - context.MARGIN_US  # healed inside the window
    active = [r for r in out if r["kind"] == "fault_active"]
    assert active and "active since" in active[0]["note"] and "redis-7003" in active[0]["note"]
    assert [r["kind"] for r in out if r["kind"].startswith("fault")] == ["fault_active", "fault_heal"]
