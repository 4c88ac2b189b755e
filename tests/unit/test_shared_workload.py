"""The shared-subscription workload ([workload] shared_groups, shared_members): members planned as persistent
subscribers of $share/g<g>/<every publisher's topic>, flapping like the others; off by default (the plan unchanged);
the reference target refuses DEVICE members at load; the drain owes each group a message once, whichever member
gets it; the $share filter parsing the checkers and the drain share (contracts/topics.py)."""

from __future__ import annotations

import pytest

from contracts.scenario import SHARED_FILTERS, ScenarioError, parse_scenario
from contracts.topics import filter_matches, matching_filter, shared_filter
from harness.drain import OutstandingDeliveries
from properties.generate import make_plan

BASE = """
[scenario]
name = "shared"
duration_s = 10
[workload]
pattern = "fan-in"
publishers = 3
subscribers = 1
rate_per_publisher = 2
{extra}
[subscribers]
disconnects_per_minute = 12
"""


def scenario(extra: str = "", broker: str = ""):
    return parse_scenario(BASE.format(extra=extra) + broker)


APP = '\n[broker]\napplication_clients = [{ client_id = "test_share_client_*" }]\n'


def test_off_by_default_the_plan_is_the_one_it_always_was():
    plain = make_plan(scenario(), 3).to_json()
    assert "$share" not in plain and "test_share_client" not in plain
    assert make_plan(scenario("shared_groups = 0"), 3).to_json() == plain


def test_members_subscribe_to_their_groups_filter_and_flap_like_subscribers():
    plan = make_plan(scenario("shared_groups = 2\nshared_members = 3", APP), 5)
    members = [c for c in plan.clients if c.client_id.startswith("test_share_client_")]
    assert [c.client_id for c in members] == [f"test_share_client_{g}_{m}" for g in range(2) for m in range(3)]
    assert all(c.persistent and c.role == "subscriber" for c in members)
    assert {c.subscriptions[0].topic_filter for c in members} == {
        f"$share/g{g}/{SHARED_FILTERS['fan-in']}" for g in range(2)}
    # every publisher's topic is the group's
    assert all(filter_matches(matching_filter(members[0].subscriptions[0].topic_filter), p.topic) for p in plan.publishes)
    acted = {a.client_id for a in plan.subscriber_actions if a.action != "connect"}
    assert acted & {c.client_id for c in members}, "the members never leave: nothing to hand over"


def test_the_reference_target_refuses_device_members_naming_the_rule_to_add():
    with pytest.raises(ScenarioError, match=r"shared_groups = 1.*APPLICATION.*test_share_client_0_0.*application_clients"):
        scenario("shared_groups = 1")
    scenario("shared_groups = 1", APP)  # accepted with the rule


def test_bad_member_counts_are_refused():
    with pytest.raises(ScenarioError, match="shared_members"):
        scenario("shared_groups = 1\nshared_members = 0", APP)


@pytest.mark.parametrize(("text", "expected"), [
    ("$share/g0/a/+", "a/+"), ("$share/g/a/b/#", "a/b/#"), ("a/+", None), ("$share//a", None), ("$share/g", None),
    ("$share/g/", None), ("$share/g+/a", None), ("$SHARE/g/a", None)])
def test_shared_filter_parsing(text, expected):
    assert shared_filter(text) == expected
    assert matching_filter(text) == (expected or text)


def test_the_drain_owes_a_group_once_and_any_member_settles_it():
    group = "$share/g0/europe/ua/kyiv/fanin/+"
    members = {"m0": frozenset({group}), "m1": frozenset({group})}
    owed = OutstandingDeliveries(member_of=members)
    listening = [("m0", [(group, 1)]), ("m1", [(group, 1)]), ("sub", [("europe/ua/kyiv/fanin/+", 1)])]
    owed.acknowledged("pub", 1, "europe/ua/kyiv/fanin/0", 1, listening)
    assert owed.owed == {(group, "pub", 1), ("sub", "pub", 1)}
    owed.delivered("m1", "pub", 1)
    assert owed.owed == {("sub", "pub", 1)}
    owed.forget("m0")  # a member's new session: the group still owes nothing more, the subscriber still is owed
    assert owed.count == 1


def test_a_member_delivery_that_overtakes_the_ack_settles_the_group():
    group = "$share/g0/t/+"
    owed = OutstandingDeliveries(member_of={"m0": frozenset({group})})
    owed.delivered("m0", "pub", 7)
    owed.acknowledged("pub", 7, "t/1", 1, [("m0", [(group, 1)])])
    assert owed.count == 0


P2P = """
[scenario]
name = "mixed"
duration_s = 8
[workload]
pairs = 3
rate_per_publisher = 2
{extra}
"""


def test_fan_in_subscribers_beside_the_pairs_on_every_publishers_topic():
    plan = make_plan(parse_scenario(P2P.format(extra="fan_in_subscribers = 2\nshared_groups = 1\n") + APP), 2)
    wide = [c for c in plan.clients if c.client_id.startswith("test_fanin_sub_client_")]
    assert [c.client_id for c in wide] == ["test_fanin_sub_client_0_0", "test_fanin_sub_client_1_0"]
    assert all(c.persistent and c.subscriptions[0].topic_filter == SHARED_FILTERS["p2p"] for c in wide)
    assert {p.topic for p in plan.publishes} == {f"europe/ua/kyiv/{i}/0" for i in range(3)}
    assert all(filter_matches(SHARED_FILTERS["p2p"], p.topic) for p in plan.publishes)
    plain = make_plan(parse_scenario(P2P.format(extra="")), 2)
    assert [c.client_id for c in plan.clients][:6] == [c.client_id for c in plain.clients]  # the pairs as before


def test_fan_in_subscribers_only_beside_p2p():
    with pytest.raises(ScenarioError, match=r"fan_in_subscribers = 2.*pattern = \"fan-in\""):
        scenario("fan_in_subscribers = 2")
