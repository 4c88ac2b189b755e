"""Plans: byte-identical for the same scenario + seed, different for different seeds, pure data."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from contracts.scenario import find_scenario, load_scenario, parse_scenario
from properties.generate import make_plan, plans
from properties.plan import CONNECT, DISCONNECT, Plan, PlanError

SMOKE = load_scenario(find_scenario("p2p-smoke"))


def test_same_seed_gives_byte_identical_plans():
    first = make_plan(SMOKE, 1).to_json()
    again = make_plan(load_scenario(find_scenario("p2p-smoke")), 1).to_json()
    assert first.encode() == again.encode()


def test_different_seeds_differ():
    texts = {make_plan(SMOKE, seed).to_json() for seed in range(5)}
    assert len(texts) == 5


def test_json_round_trip():
    plan = make_plan(SMOKE, 3)
    assert Plan.from_json(plan.to_json()) == plan
    assert Plan.from_json(plan.to_json()).to_json() == plan.to_json()


def test_p2p_pattern_matches_the_seeds():
    plan = make_plan(SMOKE, 1)
    pubs, subs = plan.publishers(), plan.subscribers()
    assert [c.client_id for c in pubs] == ["test_pub_client_0_0", "test_pub_client_1_0", "test_pub_client_2_0"]
    assert [c.client_id for c in subs] == ["test_sub_client_0_0", "test_sub_client_1_0", "test_sub_client_2_0"]
    assert [s.subscriptions[0].topic_filter for s in subs] == [f"europe/ua/kyiv/{i}/+" for i in range(3)]
    assert all(s.persistent and s.subscriptions[0].qos == 1 for s in subs)
    assert plan.publisher_ids() == {i: f"test_pub_client_{i}_0" for i in range(3)}
    for p in plan.publishes:
        i = p.publisher.split("_")[3]
        assert p.topic == f"europe/ua/kyiv/{i}/0" and p.qos == 1 and p.size == 62
        assert 0 <= p.offset_s < SMOKE.scenario.duration_s


def test_rate_and_sequence_numbers():
    plan = make_plan(SMOKE, 2)
    for publisher in plan.publishers():
        mine = [p for p in plan.publishes if p.publisher == publisher.client_id]
        assert [p.seq for p in mine] == list(range(1, len(mine) + 1))
        assert [p.offset_s for p in mine] == sorted(p.offset_s for p in mine)
        expected = SMOKE.workload.rate_per_publisher * SMOKE.scenario.duration_s
        assert abs(len(mine) - expected) <= 1


def test_subscriber_actions_alternate_and_start_connected():
    plan = make_plan(SMOKE, 4)
    assert any(a.action == DISCONNECT for a in plan.subscriber_actions), "p2p-smoke should flap subscribers"
    for sub in plan.subscribers():
        mine = [a for a in plan.subscriber_actions if a.client_id == sub.client_id]
        assert mine[0].action == CONNECT and mine[0].offset_s == 0 and not mine[0].clean_start
        for before, after in zip(mine, mine[1:], strict=False):
            assert before.action != after.action and before.offset_s <= after.offset_s


def test_expiry_only_on_mqtt5_publishers():
    scenario = load_scenario(find_scenario("p2p-expiry"))
    plan = make_plan(scenario, 1)
    expiries = {p.expiry_s for p in plan.publishes}
    assert None in expiries and expiries - {None}, "the expiry mix should give both"
    text = """[scenario]\nname='x'\nduration_s=5\n[workload]\npairs=4\nprotocol_mix={mqtt311=1,mqtt5=1}
expiry_mix={"9"=1}\n"""
    plan = make_plan(parse_scenario(text), 7)
    v311 = {c.client_id for c in plan.publishers() if c.protocol == 4}
    assert all((p.expiry_s is None) == (p.publisher in v311) for p in plan.publishes)


def test_wraparound_preset_is_carried():
    plan = make_plan(load_scenario(find_scenario("p2p-wraparound")), 1)
    assert {s.preset_last_packet_id for s in plan.subscribers()} == {65500}


def test_unreadable_plans_are_refused():
    with pytest.raises(PlanError, match="plan version 99 is not supported"):
        Plan.from_json('{"version": 99}')
    with pytest.raises(PlanError, match="not valid JSON"):
        Plan.from_json("{")


@settings(max_examples=15, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans(parse_scenario("[scenario]\nname='h'\nduration_s=3\n[workload]\npairs=2\nrate_per_publisher=2\n"
                            "protocol_mix={mqtt311=1,mqtt5=1}\n[subscribers]\ndisconnects_per_minute=30\n")))
def test_the_hypothesis_strategy_builds_valid_plans(plan: Plan):
    assert Plan.from_json(plan.to_json()) == plan
    assert len(plan.publishers()) == 2
    for sub in plan.subscribers():
        mine = [a for a in plan.subscriber_actions if a.client_id == sub.client_id]
        assert mine[0].action == CONNECT


def test_a_fault_mix_gives_fault_slots():
    """The refusal is gone now that schedules are generated (tests/unit/test_fault_schedule.py has the rest)."""
    scenario = parse_scenario("[scenario]\nname='f'\nduration_s=20\n[faults]\nmix={process_kill=1}\n",
                              source="f.toml")
    plan = make_plan(scenario, 1)
    assert plan.faults and all(f.kind == "process_kill" for f in plan.faults)


def test_hypothesis_shrinks_plans_towards_fewer_events():
    """What the shrinker of the faults/replay work relies on: simpler draws give smaller plans."""
    from hypothesis import find

    scenario = parse_scenario("[scenario]\nname='s'\nduration_s=10\n[workload]\npairs=3\n"
                              "[subscribers]\ndisconnects_per_minute=30\nabrupt_fraction=0.5\n")
    minimal = find(plans(scenario), lambda p: any(a.abrupt for a in p.subscriber_actions),
                   settings=settings(database=None, max_examples=300, deadline=None))
    disconnects = [a for a in minimal.subscriber_actions if a.action == DISCONNECT]
    assert len(disconnects) == 1 and disconnects[0].abrupt


def test_a_fault_mix_that_produced_no_fault_is_said_in_the_plan_output():

    from contracts.scenario import parse_scenario
    from properties.generate import make_plan, plan_notes

    text = ("[scenario]\nname = 'nofault'\nduration_s = 3\n[faults]\nmix = { process_kill = 1 }\n"
            "targets = { process_kill = ['broker:1'] }\nquiet_s = [5, 6]\n")
    scenario = parse_scenario(text, source="nofault.toml")
    plan = make_plan(scenario, 1)
    (note,) = plan_notes(scenario, plan)
    assert not plan.faults and "produced no fault with seed 1" in note
    roomy = parse_scenario(text.replace("duration_s = 3", "duration_s = 30"), source="roomy.toml")
    assert plan_notes(roomy, make_plan(roomy, 1)) == []  # near miss: room for a fault, no note


def test_ordeal_plan_prints_the_no_fault_note(tmp_path):
    from click.testing import CliRunner

    from ordeal.cli import main

    path = tmp_path / "nofault.toml"
    path.write_text("[scenario]\nname = 'nofault'\nduration_s = 3\n[faults]\nmix = { process_kill = 1 }\n"
                    "targets = { process_kill = ['broker:1'] }\nquiet_s = [5, 6]\n")
    result = CliRunner().invoke(main, ["plan", str(path), "--summary"])
    assert result.exit_code == 0 and "note: the fault mix (process_kill) produced no fault" in result.output


def test_session_mix_reaches_persistent_clean_persistent_and_expiry_mixes():
    """session-mix: one client id goes persistent -> clean -> persistent, and MQTT 5 reconnects draw their
    session expiry (0, short, long); publishers reconnect mid-stream with clean start."""
    scenario = load_scenario(find_scenario("session-mix"))
    plan = make_plan(scenario, 1)
    assert plan.to_json() == make_plan(load_scenario(find_scenario("session-mix")), 1).to_json()
    mixed = 0
    for sub in plan.subscribers():
        starts = [a.clean_start for a in plan.subscriber_actions if a.client_id == sub.client_id and a.action == CONNECT]
        # a clean start with a resume (clean start 0) both before and after it
        mixed += any(starts[i] and not starts[0] and not all(starts[i + 1:]) for i in range(1, len(starts) - 1))
    assert mixed, "no subscriber went persistent -> clean -> persistent"
    v5 = {c.client_id for c in plan.subscribers() if c.protocol == 5}
    expiries = {a.session_expiry_s for a in plan.subscriber_actions if a.client_id in v5 and a.action == CONNECT}
    assert {0, 2, 3600} <= expiries
    publishers = {c.client_id for c in plan.publishers()}
    moves = [a for a in plan.subscriber_actions if a.client_id in publishers]
    assert any(a.action == DISCONNECT for a in moves) and any(a.action == CONNECT for a in moves)
    assert all(a.clean_start for a in moves if a.action == CONNECT)
    assert all(a.offset_s > 0 for a in moves)


def test_new_keys_leave_other_scenarios_plans_alone():
    """No publisher reconnects, no session expiry mix: nothing more is drawn, plans stay as they were."""
    text = "[scenario]\nname='x'\nduration_s=8\n[workload]\npairs=2\nprotocol_mix={mqtt5=1}\n" \
           "[subscribers]\ndisconnects_per_minute=20\n"
    plain = make_plan(parse_scenario(text), 4)
    assert all(a.session_expiry_s in (None, 3600) for a in plain.subscriber_actions)
    assert not [a for a in plain.subscriber_actions if a.client_id.startswith("test_pub")]
    expiring = make_plan(parse_scenario(text + 'session_expiry_mix = { "3600" = 1 }\n'), 4)
    assert expiring.to_json() == plain.to_json()  # a one-value mix draws nothing


def test_message_expiry_zero_is_planned():
    plan = make_plan(load_scenario(find_scenario("expiry-zero")), 1)
    assert 0 in {p.expiry_s for p in plan.publishes}
