"""properties/reduction.py: every candidate is a valid, strictly smaller plan; the reductions do what they say."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings

from contracts.scenario import find_scenario, load_scenario
from contracts.topics import filter_matches
from properties.generate import make_plan, plans
from properties.plan import CONNECT, DISCONNECT, FaultSlot, Plan
from properties.reduction import (
    DIMENSIONS,
    candidates,
    chunked,
    client_groups,
    cut_tail,
    offline_periods,
    plan_size,
    validate_plan,
    without_clients,
    without_faults,
    without_offline_periods,
    without_publishes,
)

SMOKE = load_scenario(find_scenario("p2p-smoke"))


def with_faults(plan: Plan) -> Plan:
    """The generator does not draw fault slots yet; a shrinker must still handle them."""
    return replace(plan, faults=(
        FaultSlot("f1", "process-kill", "redis-master-of:test_sub_client_0_0", 1.0, 2.0),
        FaultSlot("f2", "process-pause", "broker:0", 2.5, 5.5, {"x": 1}),
        FaultSlot("f3", "process-kill", "kafka", 4.0, 5.0)))


def strictly_smaller(small: Plan, big: Plan) -> bool:
    a, b = plan_size(small), plan_size(big)
    fields = ("faults", "clients", "publishes", "subscriber_actions", "duration_s")
    return all(getattr(a, f) <= getattr(b, f) for f in fields) and a != b


def test_a_generated_plan_is_valid_and_the_validator_can_fail():
    plan = with_faults(make_plan(SMOKE, 1))
    assert validate_plan(plan) == []
    gapped = replace(plan, publishes=plan.publishes[1:])  # the first publish gone, seqs not renumbered
    assert any("sequence numbers" in p for p in validate_plan(gapped))
    first_connect = plan.subscriber_actions[0]
    no_connect = replace(plan, subscriber_actions=tuple(
        a for a in plan.subscriber_actions if a is not first_connect))
    assert any("first action" in p or "no connect" in p for p in validate_plan(no_connect))
    late_fault = replace(plan, faults=(replace(plan.faults[0], end_s=plan.duration_s + 1),))
    assert any("outside" in p for p in validate_plan(late_fault))


@pytest.mark.parametrize("seed", [1, 2, 3, 7])
def test_every_candidate_is_valid_and_strictly_smaller(seed):
    plan = with_faults(make_plan(SMOKE, seed))
    seen = list(candidates(plan))
    assert {c.dimension for c in seen} == set(DIMENSIONS)
    for candidate in seen:
        assert validate_plan(candidate.plan) == [], candidate.description
        assert strictly_smaller(candidate.plan, plan), candidate.description
        assert Plan.from_json(candidate.plan.to_json()) == candidate.plan


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans(SMOKE))
def test_candidates_of_any_generated_plan_are_valid(plan):
    for candidate in candidates(plan):
        assert validate_plan(candidate.plan) == [], candidate.description
        assert strictly_smaller(candidate.plan, plan)


def test_coarse_candidates_come_before_fine_ones_within_a_dimension():
    plan = make_plan(SMOKE, 1)
    chunks = [c.chunks for c in candidates(plan) if c.dimension == "publishes"]
    assert chunks == sorted(chunks) and chunks[0] == 2 and chunks[-1] == len(plan.publishes)
    # one publish dropped at the finest level, each exactly once
    finest = [c for c in candidates(plan) if c.dimension == "publishes" and c.chunks == len(plan.publishes)]
    assert len(finest) == len(plan.publishes)
    assert all(len(c.plan.publishes) == len(plan.publishes) - 1 for c in finest)


def test_start_chunks_skips_the_coarse_levels():
    plan = make_plan(SMOKE, 1)
    chunks = {c.chunks for c in candidates(plan, {"publishes": 8}) if c.dimension == "publishes"}
    assert min(chunks) == 8


def test_dropping_publishes_renumbers_each_publisher_from_one():
    plan = make_plan(SMOKE, 1)
    publisher = plan.publishes[0].publisher
    own = [i for i, p in enumerate(plan.publishes) if p.publisher == publisher]
    smaller = without_publishes(plan, {own[0], own[2]})
    mine = [p for p in smaller.publishes if p.publisher == publisher]
    assert [p.seq for p in mine] == list(range(1, len(own) - 1))
    kept_offsets = [plan.publishes[i].offset_s for i in own if i not in (own[0], own[2])]
    assert [p.offset_s for p in mine] == kept_offsets


def test_dropping_a_client_drops_all_its_events():
    plan = make_plan(SMOKE, 1)
    smaller = without_clients(plan, {"test_pub_client_1_0", "test_sub_client_2_0"})
    assert {c.client_id for c in smaller.clients} == {c.client_id for c in plan.clients} - {
        "test_pub_client_1_0", "test_sub_client_2_0"}
    assert all(p.publisher != "test_pub_client_1_0" for p in smaller.publishes)
    assert all(a.client_id != "test_sub_client_2_0" for a in smaller.subscriber_actions)
    assert smaller.publisher_ids() == {0: "test_pub_client_0_0", 2: "test_pub_client_2_0"}  # indices kept


def test_offline_periods_pair_a_disconnect_with_its_reconnect():
    plan = make_plan(SMOKE, 1)
    periods = offline_periods(plan)
    assert periods, "p2p-smoke seed 1 has subscriber reconnects"
    for period in periods:
        actions = [plan.subscriber_actions[i] for i in period]
        assert actions[0].action == DISCONNECT
        assert len({a.client_id for a in actions}) == 1
        if len(actions) == 2:
            assert actions[1].action == CONNECT and actions[1].offset_s > actions[0].offset_s
    quiet = without_offline_periods(plan, periods)
    assert all(a.action == CONNECT and a.offset_s == 0.0 for a in quiet.subscriber_actions)
    assert len(quiet.subscriber_actions) == len(plan.subscribers())


def test_cut_tail_drops_late_events_and_ends_faults_at_the_new_end():
    plan = with_faults(make_plan(SMOKE, 1))
    short = cut_tail(plan, 3.0)
    assert short.duration_s == 3.0
    assert short.publishes and all(p.offset_s < 3.0 for p in short.publishes)
    assert all(a.offset_s < 3.0 for a in short.subscriber_actions)
    assert [f.fault_id for f in short.faults] == ["f1", "f2"]
    assert short.faults[1].end_s == 3.0 and short.faults[0].end_s == 2.0
    assert validate_plan(short) == []


def test_without_faults_and_chunking():
    plan = with_faults(make_plan(SMOKE, 1))
    assert [f.fault_id for f in without_faults(plan, {1}).faults] == ["f1", "f3"]
    assert [list(r) for r in chunked(5, 2)] == [[0, 1, 2], [3, 4]]
    assert [list(r) for r in chunked(3, 8)] == [[0], [1], [2]]
    assert sum(len(r) for r in chunked(37, 4)) == 37


def test_a_single_client_plan_offers_no_client_candidates():
    plan = make_plan(SMOKE, 1)
    one = without_clients(plan, {c.client_id for c in plan.clients[1:]})
    assert not [c for c in candidates(one) if c.dimension == "clients"]


def test_clients_are_dropped_by_pairs_first_and_keep_a_publisher_and_a_subscriber():
    plan = make_plan(SMOKE, 1)
    assert client_groups(plan) == [(f"test_pub_client_{i}_0", f"test_sub_client_{i}_0") for i in range(3)]
    client_candidates = [c for c in candidates(plan) if c.dimension == "clients"]
    first = client_candidates[0].plan
    # 3 groups in 2 chunks, [0, 1] and [2]: the first candidate keeps pair 2 only
    assert {c.client_id for c in first.clients} == {"test_pub_client_2_0", "test_sub_client_2_0"}
    pair = without_clients(plan, {c.client_id for c in plan.clients if not c.client_id.endswith("_1_0")})
    assert not [c for c in candidates(pair) if c.dimension == "clients"]


def test_filter_matches():
    assert filter_matches("europe/ua/kyiv/1/+", "europe/ua/kyiv/1/0")
    assert not filter_matches("europe/ua/kyiv/1/+", "europe/ua/kyiv/2/0")
    assert filter_matches("europe/#", "europe/ua/kyiv/2/0")
    assert filter_matches("europe/+", "europe/ua")
    assert not filter_matches("a/b", "a/b/c")
