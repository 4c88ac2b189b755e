"""The Will and retained workloads (properties/generate.py WillSpec, RetainedSpec): drawn only when asked for, a
Will per chosen subscriber (a Will Delay on MQTT 5 only) and one watcher, retained publishes on the retained
topics and late clean-session subscribers; deterministic and read back from plan.json unchanged."""

from __future__ import annotations

import json

from contracts.history_schema import (
    RETAINED_FILTER,
    RETAINED_TOPIC_PREFIX,
    WILL_FILTER,
    WILL_WATCHER,
    will_topic,
)
from contracts.scenario import parse_scenario
from properties.generate import RandomDraw, RetainedSpec, WillSpec, generate_plan, make_plan
from properties.plan import Plan

SCENARIO = parse_scenario("""
[scenario]
name = "wills"
duration_s = 10
[workload]
pairs = 6
rate_per_publisher = 3
protocol_mix = { mqtt311 = 1, mqtt5 = 1 }
[subscribers]
disconnects_per_minute = 12
""")
WILLS = WillSpec(1.0, ((None, 1.0), (3, 1.0)))
RETAINED = RetainedSpec(0.3, 2, 2)
OFF_WILLS, OFF_RETAINED = WillSpec(), RetainedSpec()


def plan(seed=1, wills=OFF_WILLS, retained=OFF_RETAINED):
    return generate_plan(SCENARIO, seed, RandomDraw(seed), wills, retained)


def test_off_by_default_the_plan_is_the_one_it_always_was():
    assert plan().to_json() == make_plan(SCENARIO, 1).to_json()
    text = plan().to_json()
    assert '"will"' not in text and '"retain"' not in text and WILL_WATCHER not in text


def test_every_chosen_subscriber_sends_a_will_and_one_watcher_records_them():
    p = plan(wills=WILLS)
    subscribers = [c for c in p.subscribers() if c.client_id != WILL_WATCHER]
    assert all(c.will is not None and c.will.topic == will_topic(c.client_id) and c.will.qos == 1
               for c in subscribers)
    assert all(c.will.delay_s is None for c in subscribers if c.protocol == 4)  # a Will Delay is MQTT 5's
    assert {c.will.delay_s for c in subscribers if c.protocol == 5} <= {None, 3}
    watcher = p.client(WILL_WATCHER)
    assert watcher.will is None and watcher.persistent and [s.topic_filter for s in watcher.subscriptions] == [WILL_FILTER]
    assert [(a.offset_s, a.action) for a in p.subscriber_actions if a.client_id == WILL_WATCHER] == [(0.0, "connect")]
    # the Will workload is drawn after everything else: the rest of the plan is unchanged
    assert p.publishes == plan().publishes and p.faults == plan().faults


def test_retained_publishes_and_late_subscribers():
    p = plan(retained=RETAINED)
    retained = [x for x in p.publishes if x.retain]
    assert 0 < len(retained) < len(p.publishes)
    assert {x.topic for x in retained} <= {RETAINED_TOPIC_PREFIX + "0", RETAINED_TOPIC_PREFIX + "1"}
    assert not any(x.topic.startswith(RETAINED_TOPIC_PREFIX) for x in p.publishes if not x.retain)
    late = [c for c in p.clients if c.client_id.startswith("test_late_sub_client_")]
    assert len(late) == 2 and not any(c.persistent for c in late)
    assert all([s.topic_filter for s in c.subscriptions] == [RETAINED_FILTER] for c in late)
    connects = [a for a in p.subscriber_actions if a.client_id.startswith("test_late_sub_client_")]
    assert len(connects) == 2 and all(a.clean_start and 3.0 <= a.offset_s <= 9.0 for a in connects)
    assert not any(a.action == "disconnect" for a in p.subscriber_actions if a.client_id.startswith("test_late_"))


def test_deterministic_and_read_back_unchanged():
    a, b = plan(wills=WILLS, retained=RETAINED), plan(wills=WILLS, retained=RETAINED)
    assert a.to_json() == b.to_json()
    assert Plan.from_json(a.to_json()) == a
    data = json.loads(a.to_json())
    assert any("will" in c for c in data["clients"]) and any(x.get("retain") for x in data["publishes"])
    assert plan(seed=2, wills=WILLS, retained=RETAINED).to_json() != a.to_json()


def test_a_311_only_workload_gets_a_315_watcher():
    only_311 = parse_scenario('[scenario]\nname = "w"\nduration_s = 3\n[workload]\npairs = 2\n')
    p = generate_plan(only_311, 1, RandomDraw(1), WillSpec(1.0))
    assert p.client(WILL_WATCHER).protocol == 4 and p.client(WILL_WATCHER).session_expiry_s is None
