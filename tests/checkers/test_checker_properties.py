"""Hypothesis: generated valid histories always pass; one mutation always fails the matching invariant.

Spark costs seconds per call, so each example checks a whole batch (clean + mutated histories) in one job.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark_checkers import synthetic as s
from spark_checkers.api import check_runs

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]  # one Spark batch; slow when the machine is loaded
MUTATIONS = ("drop", "swap", "packet_id", "delay")
EXPECTED = {"drop": "durability.lost", "swap": "order.out_of_order", "packet_id": "order.packet_id_invalid",
            "delay": "expiry.delivered_expired"}


@st.composite
def specs(draw, mutation: str) -> s.Spec:
    pairs = draw(st.integers(1, 3))
    messages = draw(st.integers(3, 12))
    protocol = 5 if mutation == "delay" else draw(st.sampled_from([4, 5]))
    offline = []
    for subscriber in range(pairs):
        if draw(st.booleans()):
            start = draw(st.integers(2, messages))
            offline.append(s.Offline(subscriber, start, draw(st.integers(start + 1, messages + 1))))
    limit = 10000 if mutation == "drop" else draw(st.sampled_from([10000, 2, 3]))
    expiry = 5 if mutation == "delay" else (None if mutation == "drop" or protocol == 4
                                            else draw(st.sampled_from([None, 30])))
    return s.Spec(pairs=pairs, messages=messages, protocol=protocol, offline=tuple(offline), limit=limit,
                  expiry_s=expiry, first_packet_id=draw(st.sampled_from([1, 65530, 65535])),
                  watcher=draw(st.booleans()),
                  faults=(s.Fault("f1", "kill", "redis-7001", 2, 3),) if draw(st.booleans()) else ())


def mutate(rows: list[dict], mutation: str, choice: int) -> list[dict]:
    delivered = s.deliveries(rows)
    if mutation == "drop":
        target = delivered[choice % len(delivered)]
        return s.drop_delivery(rows, target["client"], target["publisher"], target["pub_seq"])
    if mutation == "swap":
        # two consecutive first deliveries of one (subscriber, publisher) stream
        pairs = []
        for (client, publisher), group in itertools.groupby(
                sorted(delivered, key=lambda d: (d["client"], d["publisher"], d["t_mono_us"])),
                key=lambda d: (d["client"], d["publisher"])):
            group = list(group)
            pairs += [(client, publisher, a["pub_seq"], b["pub_seq"]) for a, b in zip(group, group[1:], strict=False)]
        client, publisher, a, b = pairs[choice % len(pairs)]
        return s.swap_deliveries(rows, client, publisher, a, b)
    if mutation == "packet_id":
        target = delivered[choice % len(delivered)]
        return s.set_delivery_field(rows, target["client"], target["publisher"], target["pub_seq"], packet_id=0)
    if mutation == "delay":
        # the last delivery of one subscriber: moving it later overtakes nothing
        clients = sorted({d["client"] for d in delivered})
        client = clients[choice % len(clients)]
        last = s.deliveries(rows, client)[-1]
        invoke = s.publish_row(rows, "publish_invoke", last["publisher"], last["pub_seq"])
        late = invoke["t_mono_us"] + 5_000_000 + 200_000 + 1_000
        moved = s.move_delivery(rows, client, last["publisher"], last["pub_seq"], late)
        return s.set_delivery_field(moved, client, last["publisher"], last["pub_seq"], remaining_expiry_s=0)
    raise ValueError(mutation)


def cases():
    return st.lists(st.sampled_from(MUTATIONS).flatmap(
        lambda m: st.tuples(st.just(m), specs(m), st.integers(0, 1000))), min_size=8, max_size=8)


# derandomize: a fixed seed, so every run checks the same batch and always asserts what it asserted before
# (a random single draw could skip every case and assert nothing); explore new draws with
# --hypothesis-seed=random or by raising max_examples locally.
@settings(max_examples=1, deadline=None, suppress_health_check=list(HealthCheck), database=None, derandomize=True)
@given(batch=cases())
def test_valid_histories_pass_and_one_mutation_fails_its_invariant(spark, tmp_path_factory, batch):
    root = tmp_path_factory.mktemp("prop")
    dirs, expected = [], []
    for index, (mutation, spec, choice) in enumerate(batch):
        rows = s.generate(spec)
        if not s.deliveries(rows):
            continue
        if mutation == "swap" and all(m == 1 for m in [spec.messages]):
            continue
        dirs.append(s.write_run(root / f"clean{index}", rows, spec))
        expected.append((f"clean {mutation} {spec}", set()))
        dirs.append(s.write_run(root / f"mutated{index}", mutate(rows, mutation, choice), replace(spec)))
        expected.append((f"{mutation} #{choice} {spec}", {EXPECTED[mutation]}))
    assert len(dirs) >= 4, f"the batch left only {len(dirs)} histories with deliveries: too little was checked"
    reports = check_runs(dirs, spark=spark)
    for (label, want), report in zip(expected, reports, strict=True):
        failing = {i["id"] for i in report["invariants"] if i["verdict"] == "fail"}
        unknown = {i["id"] for i in report["invariants"] if i["verdict"] == "unknown"}
        assert (failing, unknown) == (want, set()), (label, [
            (i["id"], [w["text"] for w in i["witnesses"]]) for i in report["invariants"] if i["verdict"] == "fail"])
