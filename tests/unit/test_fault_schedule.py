"""Fault schedules generated from a scenario's fault mix (properties/generate.py): deterministic per seed,
weighted by the mix, quiet periods between faults, one fault at a time, all over before the tail, targets
and parameters valid for the nemesis."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings

from contracts.scenario import ScenarioError, default_scenarios_dir, load_scenario, parse_scenario
from faults.nemesis import schedule_from_slots
from properties.generate import _online_intervals, make_plan, plans
from properties.plan import Plan

FAULT_SCENARIOS = sorted(p for p in default_scenarios_dir().glob("*.toml") if load_scenario(p).faults.mix)
SOAK_PLANNED_S = 60.0  # the soak's hour at 500 msg/s is 1.8 M publishes: its schedule is checked on one minute


def _load(path):
    """The shipped scenario, a soak cut to SOAK_PLANNED_S (benchmarks/soak.py --short plays the same cut)."""
    scenario = load_scenario(path)
    if scenario.scenario.tier != "soak":
        return scenario
    return dataclasses.replace(scenario, scenario=dataclasses.replace(scenario.scenario, duration_s=SOAK_PLANNED_S))

MIXED = """
[scenario]
name = "mixed"
duration_s = 60
[workload]
pairs = 4
[subscribers]
disconnects_per_minute = 6
offline_s = [1, 2]
[faults]
mix = { process_kill = 3, client_flap = 1, net_partition = 1 }
quiet_s = [1, 2]
duration_s = [1, 3]
tail_s = 5
params = { net_partition = { a = "client:{subscriber}", b = "broker" } }
choices = { client_flap = { mode = ["abrupt", "clean"], clean_start = [false, true] } }
"""


def test_the_fault_scenarios_are_shipped():
    names = {p.stem for p in FAULT_SCENARIOS}
    assert {"redis-master-kill", "redis-failover-under-load", "kafka-broker-kill", "broker-node-kill",
            "partition-broker-redis", "partition-client-broker", "subscriber-flapping", "reconnect-storm",
            "chaos-mix"} <= names


@pytest.mark.parametrize("path", FAULT_SCENARIOS, ids=[p.stem for p in FAULT_SCENARIOS])
def test_each_fault_scenario_plans_deterministically(path):
    first = make_plan(_load(path), 7).to_json()
    again = make_plan(_load(path), 7).to_json()
    assert first.encode() == again.encode()
    plan = Plan.from_json(first)
    assert plan.faults, f"{path.name}: seed 7 schedules no fault"
    assert Plan.from_json(first).to_json() == first
    seeds = range(4) if _load(path).scenario.tier == "smoke" else range(2)  # nightly plans are big
    assert len({make_plan(_load(path), seed).to_json() for seed in seeds}) == len(seeds)


@pytest.mark.parametrize("path", FAULT_SCENARIOS, ids=[p.stem for p in FAULT_SCENARIOS])
def test_fault_scenario_schedules_fit_the_workload(path):
    scenario = _load(path)
    if scenario.scenario.tier == "smoke":
        assert scenario.scenario.duration_s <= 20, "smoke-sized fault scenarios stay short (CI)"
    for seed in range(10 if scenario.scenario.tier == "smoke" else 3):
        _check_schedule(scenario, make_plan(scenario, seed))


def _check_schedule(scenario, plan: Plan) -> None:
    spec = scenario.faults
    last_end = scenario.scenario.duration_s - spec.tail_s
    previous_end = 0.0
    for slot in plan.faults:  # one lane: never two faults at once, hence never two on one node
        assert slot.start_s >= previous_end + spec.quiet_s[0] - 1e-6, "a quiet period precedes every fault"
        assert spec.duration_s[0] - 1e-6 <= slot.end_s - slot.start_s <= spec.duration_s[1] + 1e-6
        assert slot.end_s <= last_end + 1e-9, "every fault ends before the tail, so the final phase heals"
        assert dict(spec.mix)[slot.kind] > 0
        previous_end = slot.end_s
    if spec.max_faults:
        assert len(plan.faults) <= spec.max_faults
    schedule = schedule_from_slots(plan.faults)  # the nemesis accepts it: targets and params are valid
    for item, slot in zip(schedule, plan.faults, strict=True):
        assert dict(item.spec.params) == dict(slot.params), "plan.json holds the full parameters"


def test_kinds_are_weighted_by_the_mix():
    scenario = parse_scenario(MIXED, source="mixed.toml")
    kinds = Counter(slot.kind for seed in range(40) for slot in make_plan(scenario, seed).faults)
    total = sum(kinds.values())
    assert total > 300
    assert 0.5 < kinds["process_kill"] / total < 0.7  # weight 3 of 5
    assert 0.12 < kinds["client_flap"] / total < 0.28
    assert 0.12 < kinds["net_partition"] / total < 0.28


def test_subscriber_placeholders_name_a_client_the_plan_keeps_connected():
    scenario = parse_scenario(MIXED, source="mixed.toml")
    subscribers = set()
    for seed in range(20):
        plan = make_plan(scenario, seed)
        online = _online_intervals(list(plan.subscriber_actions), plan.duration_s)
        for slot in plan.faults:
            if slot.kind == "client_flap":
                client = slot.target
            elif slot.kind == "net_partition":
                client = slot.params["a"].split(":", 1)[1]
            else:
                assert slot.target in ("redis-master-of:" + c.client_id for c in plan.subscribers()) or \
                    "{" not in slot.target
                continue
            subscribers.add(client)
            assert any(b <= slot.start_s - 1.0 and slot.end_s + 1.0 <= e for b, e in online[client]), \
                f"seed {seed}: {slot.fault_id} names {client}, which the plan has offline during the fault"
        assert "{subscriber}" not in plan.to_json()
    assert len(subscribers) > 1


def test_drawn_choices_vary_and_defaults_are_filled():
    scenario = parse_scenario(MIXED, source="mixed.toml")
    flaps = [s for seed in range(30) for s in make_plan(scenario, seed).faults if s.kind == "client_flap"]
    assert {s.params["mode"] for s in flaps} == {"abrupt", "clean"}
    assert {s.params["clean_start"] for s in flaps} == {False, True}
    assert all(s.params["reconnect"] is True and s.params["node"] == "same" for s in flaps)


def test_no_mix_no_faults_and_max_faults():
    assert make_plan(parse_scenario("[scenario]\nname='q'\nduration_s=30\n"), 1).faults == ()
    capped = parse_scenario(MIXED.replace("tail_s = 5", "tail_s = 5\nmax_faults = 2"), source="m.toml")
    assert all(len(make_plan(capped, seed).faults) <= 2 for seed in range(10))
    assert any(len(make_plan(capped, seed).faults) == 2 for seed in range(10))


def test_a_workload_too_short_for_any_fault_plans_none():
    scenario = parse_scenario("[scenario]\nname='s'\nduration_s=3\n[faults]\nmix={process_kill=1}\n"
                              "quiet_s=[2,3]\nduration_s=[2,3]\ntail_s=1\n")
    assert make_plan(scenario, 1).faults == ()


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(plans(parse_scenario(MIXED, source="mixed.toml")))
def test_the_hypothesis_strategy_generates_valid_schedules(plan: Plan):
    _check_schedule(parse_scenario(MIXED, source="mixed.toml"), plan)


@pytest.mark.parametrize("table, message", [
    ("mix = { process_kill = 1 }\ntargets = { redis_failover = ['kafka'] }",
     r"\[faults\] targets.redis_failover = .*not in the mix"),
    ("mix = { process_kill = 1 }\ntargets = { process_kill = ['redis-master-off:x'] }",
     r"\[faults\] targets.process_kill = 'redis-master-off:x'.*not understood"),
    ("mix = { net_partition = 1 }", r"\[faults\] params.net_partition = .*missing required parameter a"),
    ("mix = { client_flap = 1 }\nchoices = { client_flap = { mode = ['abrupt', 'sideways'] } }",
     r"\[faults\] .*client_flap.*'mode' = 'sideways'"),
    ("mix = { client_flap = 1 }\nparams = { client_flap = { mode = 'clean' } }\n"
     "choices = { client_flap = { mode = ['abrupt'] } }", r"choices.client_flap.mode .*also fixed"),
    ("mix = { client_reconnect_storm = 1 }\ntargets = { client_reconnect_storm = ['kafka'] }",
     r"takes no target"),
    ("mix = { process_kill = 1 }\nchoices = { process_kill = { wait_promotion = [] } }",
     r"choices.process_kill = .*parameter = \[values"),
])
def test_fault_tables_are_validated_on_load(table: str, message: str):
    with pytest.raises(ScenarioError, match=message):
        parse_scenario(f"[scenario]\nname='v'\nduration_s=30\n[faults]\n{table}\n", source="v.toml")


def test_normalised_faults_show_targets_params_and_choices():
    faults = parse_scenario(MIXED, source="mixed.toml").to_dict()["faults"]
    assert faults["targets"]["process_kill"][0] == "redis-master-of:{subscriber}"  # the default, filled in
    assert faults["params"] == {"net_partition": {"a": "client:{subscriber}", "b": "broker"}}
    assert faults["choices"]["client_flap"] == {"clean_start": [False, True], "mode": ["abrupt", "clean"]}
    assert faults["tail_s"] == 5.0 and faults["max_faults"] == 0
