"""The oracle (oracle/) on its own, without Spark: it fails exactly what the anomaly catalog plants (each case's
near-miss twins pass), a correct broker's generated histories pass it, every perturbation of the generator finds
a place, and each rule the catalog does not plant (the MQTT 5 and QoS 2 rules) fails on its planted anomaly and
passes on the near-miss twin beside it.

Pure Python and pyarrow, no JVM: it sits beside the property test that compares the oracle with the checkers
(test_oracle_property.py) rather than in tests/unit because both read the same generator and catalog."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from support import anomalies

from contracts.history_schema import Kind
from oracle import COVERED, judge, judge_loaded
from oracle.generate import draw, scenario_of
from oracle.perturb import PERTURBATIONS
from oracle.plan import Behaviour, Plan, Publisher, Setup, Step, Subscriber
from oracle.run import Run, declared_from
from oracle.simulate import simulate


@pytest.fixture(scope="module")
def catalog(tmp_path_factory) -> dict[str, Path]:
    return anomalies.write_runs(tmp_path_factory.mktemp("catalog"))


@pytest.mark.parametrize("name", sorted(anomalies.CASES))
def test_the_oracle_fails_what_the_anomaly_catalog_plants(catalog, name):
    expected = set(anomalies.CASES[name][2]) & set(COVERED)
    verdicts = judge(catalog[name]).verdicts
    failing = {i for i, v in verdicts.items() if v.verdict == "fail"}
    unknown = {i for i, v in verdicts.items() if v.verdict == "unknown"}
    assert (failing, unknown) == (expected, set()), {i: verdicts[i].items for i in failing ^ expected}


@pytest.mark.parametrize("name", sorted(anomalies.UNKNOWN_CASES))
def test_the_oracle_is_unknown_where_the_anomaly_catalog_says(catalog, name):
    expected = set(anomalies.UNKNOWN_CASES[name][3]) & set(COVERED)
    verdicts = judge(catalog[name]).verdicts
    assert expected <= {i for i, v in verdicts.items() if v.verdict == "unknown"}


@pytest.fixture(scope="module")
def generated():
    return draw(40, 20261202)


def _corrected(run) -> Plan:
    """The run's plan on a correct broker: no anomaly planted, the broker's knobs at their correct settings."""
    return replace(run.plan, behaviour=replace(run.plan.behaviour, trim="oldest", slow_acks=False))


def test_a_correct_brokers_generated_histories_pass_the_oracle(generated):
    for run in generated:
        plan = _corrected(run)
        verdicts = judge_loaded(_run(simulate(plan), plan.setup)).verdicts
        bad = {i: (v.verdict, v.items) for i, v in verdicts.items()
               if v.verdict not in ("pass", "not_applicable", "allowed")}
        assert not bad, (plan, bad)


def test_every_perturbation_finds_a_place_in_some_generated_history(generated):
    placed = set()
    for run in generated[:30]:
        rows = simulate(run.plan)
        placed |= {name for name, f in PERTURBATIONS.items() if f(rows, 12345) is not None}
    assert placed == set(PERTURBATIONS)


# --- Planted anomalies and near-miss twins of the rules the catalog does not plant ---------------------------


TIGHT = Setup(tolerance_ms=100, slack_ms=20)  # every planted case below is built on these bounds


def _run(rows: list[dict], setup: Setup = TIGHT) -> Run:
    rows = sorted(rows, key=lambda r: r["t_mono_us"])
    return Run(Path("<generated>"), tuple({**r, "seq": i, "t_wall_us": r["t_mono_us"]} for i, r in enumerate(rows, 1)),
               declared_from(scenario_of(setup)), 2)


def _verdict(rows: list[dict], invariant: str, setup: Setup = TIGHT) -> tuple[str, int]:
    v = judge_loaded(_run(rows, setup)).verdicts[invariant]
    return v.verdict, v.count


def _history(*steps: Step, published_qos: int = 1, granted: int = 1, protocol: int = 5, **sub) -> list[dict]:
    """One MQTT 5 publisher, one persistent subscriber on t/# (``sub``: its other fields), the steps played."""
    subscriber = Subscriber("sub-0", protocol, True, sub.pop("session_expiry_s", 3600) if protocol == 5 else None,
                            "t/#", granted, **sub)
    steps = steps or (Step("publish", 5, qos=published_qos, expiry_s=60, content_type="text/plain"),)
    return simulate(Plan(TIGHT, (Publisher("pub-0", 5, ("t/pub-0/0",)),),
                         (subscriber,), steps, Behaviour(seed=1)))


def _edit(rows: list[dict], kind: str, nth: int = 0, **fields) -> list[dict]:
    """The rows with the ``nth`` row of ``kind`` (of sub-0) changed."""
    rows = [dict(r) for r in rows]
    [r for r in rows if r["kind"] == kind and r.get("client") == "sub-0"][nth].update(fields)
    return rows


def test_qos_upgraded_planted_and_near_miss():
    rows = _history(published_qos=1, granted=2)
    assert _verdict(rows, "qos.upgraded") == ("pass", 0)
    assert _verdict(_edit(rows, Kind.DELIVERY, qos=2), "qos.upgraded") == ("fail", 1)
    assert _verdict(_edit(rows, Kind.DELIVERY, qos=2), "qos.above_grant") == ("pass", 0)  # the grant allows 2


def test_qos_above_grant_planted_and_near_miss():
    rows = _history(published_qos=2, granted=1)
    assert _verdict(rows, "qos.above_grant") == ("pass", 0)
    assert _verdict(_edit(rows, Kind.DELIVERY, qos=2), "qos.above_grant") == ("fail", 1)
    assert _verdict(_edit(rows, Kind.DELIVERY, qos=2), "qos.upgraded") == ("pass", 0)  # published at 2


def test_qos_downgraded_planted_and_near_miss():
    assert _verdict(_history(published_qos=2, granted=2), "qos.downgraded") == ("pass", 0)
    assert _verdict(_history(published_qos=2, granted=1), "qos.downgraded") == ("pass", 0)  # min(2, 1) = 1
    assert _verdict(_edit(_history(published_qos=2, granted=2), Kind.DELIVERY, qos=1), "qos.downgraded") == ("fail", 1)


def test_expiry_property_missing_planted_and_near_miss():
    rows = _history()
    assert _verdict(rows, "expiry.property_missing") == ("pass", 0)
    assert _verdict(_edit(rows, Kind.DELIVERY, remaining_expiry_s=None), "expiry.property_missing") == ("fail", 1)
    # An MQTT 3.1.1 subscriber gets no properties at all: nothing missing (the MQTT 5 publisher keeps it applicable).
    assert _verdict(_history(protocol=4), "expiry.property_missing") == ("pass", 0)


def test_props_forwarded_changed_planted_and_near_miss():
    rows = _history()
    assert _verdict(rows, "props.forwarded_changed") == ("pass", 0)
    changed = json.dumps({"content_type": "text/html"}, separators=(",", ":"))
    assert _verdict(_edit(rows, Kind.DELIVERY, props=changed), "props.forwarded_changed") == ("fail", 1)
    assert _verdict(_edit(rows, Kind.DELIVERY, props=None), "props.forwarded_changed") == ("fail", 1)
    assert _verdict(_history(protocol=4), "props.forwarded_changed") == ("pass", 0)


def test_flow_receive_maximum_planted_and_near_miss():
    burst = tuple(Step("publish", 0, qos=1) for _ in range(3))
    rows = _history(*burst, receive_maximum=1)
    assert _verdict(rows, "flow.receive_maximum") == ("pass", 0)  # the broker waited for each ack
    first_ack = next(r for r in rows if r["kind"] == Kind.DELIVERY_ACK_SENT and r["client"] == "sub-0")
    assert _verdict([r for r in rows if r is not first_ack], "flow.receive_maximum") == ("fail", 2)


def test_flow_packet_too_large_planted_and_near_miss():
    rows = _history()
    size = next(r for r in rows if r["kind"] == Kind.DELIVERY)["packet_size"]
    detail = {"why": "start", "role": "subscriber"}
    at_size = _edit(rows, Kind.CONNECT, detail=json.dumps({**detail, "maximum_packet_size": size}))
    assert _verdict(at_size, "flow.packet_too_large") == ("pass", 0)
    below = _edit(rows, Kind.CONNECT, detail=json.dumps({**detail, "maximum_packet_size": size - 1}))
    assert _verdict(below, "flow.packet_too_large") == ("fail", 1)


def test_durability_expired_session_present_planted_and_near_miss():
    away = (Step("publish", 5), Step("leave", 5), Step("publish", 1500), Step("back", 10))
    expired = _history(*away, session_expiry_s=1)  # back 1.5 s after leaving
    assert _verdict(expired, "durability.expired_session_present") == ("pass", 0)  # the broker said present 0
    presented = _edit(expired, Kind.CONNECT, 1, session_present=True)
    assert _verdict(presented, "durability.expired_session_present") == ("fail", 1)
    # A fault in the offline window excuses it (the broker's session clock may have stood still).
    gone = next(r for r in presented if r["kind"] == Kind.DISCONNECT)
    faulted = [*presented, {"kind": Kind.NODE_EVENT, "t_mono_us": gone["t_mono_us"] + 1000, "node": "broker-1",
                            "detail": json.dumps({"action": "restart"})}]
    assert _verdict(faulted, "durability.expired_session_present") == ("pass", 0)
    assert _verdict(_history(*away, session_expiry_s=3600), "durability.expired_session_present") == ("pass", 0)


def _cut_after_pubrec(session_present: bool, released: bool) -> list[dict]:
    """A QoS 2 message answered with PUBREC, the connection cut 300 ms later, a reconnect (session present as
    given), and then (``released``) the PUBREL again and the release."""
    rows = [dict(r) for r in _history(published_qos=2, granted=2)]
    rec = next(r for r in rows if r["kind"] == Kind.QOS2_RECEIVED)
    flow = [r for r in rows if r.get("client") == "sub-0" and r["kind"] in (
        Kind.PUBREL_RECEIVED, Kind.DELIVERY, Kind.DELIVERY_ACK_SENT)]
    rest = [r for r in rows if not any(r is f for f in flow)]
    t = rec["t_mono_us"]
    cut = [{"kind": Kind.DISCONNECT, "t_mono_us": t + 300_000, "client": "sub-0", "protocol": 5, "initiator": "harness",
            "abrupt": True},
           {"kind": Kind.CONNECT, "t_mono_us": t + 400_000, "client": "sub-0", "protocol": 5, "clean_start": False,
            "session_present": session_present, "reason_code": 0, "session_expiry_s": 3600}]
    moved = [{**r, "t_mono_us": t + 500_000 + i} for i, r in enumerate(flow)] if released else []
    return [*rest, *cut, *moved]


def test_qos2_pubrel_not_resent_planted_and_near_miss():
    assert _verdict(_cut_after_pubrec(True, released=True), "qos2.pubrel_not_resent") == ("pass", 0)
    assert _verdict(_cut_after_pubrec(True, released=False), "qos2.pubrel_not_resent") == ("fail", 1)
    # Session present 0: a new session owes nothing of the old one (a loss there is durability.session_lost).
    assert _verdict(_cut_after_pubrec(False, released=False), "qos2.pubrel_not_resent") == ("pass", 0)
