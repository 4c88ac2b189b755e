"""Clock faults (faults/clock.py, faults/libfaketime.py): spec validation names the fault id, the parameter and the
allowed values; roles libfaketime cannot reach are refused at load; each kind's offset-file contents over a
slot; which roles a plan preloads; the offset file's format and the clock-reading arithmetic."""

from __future__ import annotations

import pytest

from faults.base import FaultSpecError
from faults.catalog import PROVIDER_GAPS, external_refusal, provider_supports, validate_spec
from faults.clock import CLOCK_KINDS, change_times, file_contents, planned_clock_roles, planned_offset
from faults.libfaketime import (
    ClockFile,
    ClockSetup,
    format_offset,
    offset_file_of,
    parse_offset,
    seen_offset,
)
from properties.plan import FaultSlot


def spec(kind: str, target: str = "broker:1", **params):
    return {"id": "skew1", "kind": kind, "target": target, "params": params}


def test_defaults_are_filled():
    assert validate_spec(spec("clock_offset")).params == {"offset_s": 30.0}
    assert validate_spec(spec("clock_jump", delta_s=-5)).params == {"delta_s": -5.0, "instant": False}
    assert validate_spec(spec("clock_strobe")).params == {"offset_a_s": 0.0, "offset_b_s": 30.0, "period_s": 1.0}
    assert validate_spec(spec("clock_drift")).params == {"rate_ppm": 100000.0, "update_s": 0.1}


@pytest.mark.parametrize(("kind", "params", "names"), [
    ("clock_offset", {"offset_s": 0}, ["'offset_s'", "non-zero"]),
    ("clock_offset", {"offset_s": "30"}, ["'offset_s'", "float"]),
    ("clock_offset", {"offset_s": 4e8}, ["'offset_s'", "<= 315360000"]),
    ("clock_jump", {"delta_s": 0.0}, ["'delta_s'", "non-zero"]),
    ("clock_jump", {"instant": "yes"}, ["'instant'", "bool"]),
    ("clock_strobe", {"period_s": 0.05}, ["'period_s'", ">= 0.2"]),
    ("clock_strobe", {"offset_a_s": 5, "offset_b_s": 5}, ["offset_a_s = offset_b_s", "two different offsets"]),
    ("clock_drift", {"rate_ppm": 2e6}, ["'rate_ppm'", "<= 1000000"]),
    ("clock_drift", {"rate_ppm": 0}, ["'rate_ppm'", "non-zero"]),
    ("clock_drift", {"update_s": 0.001}, ["'update_s'", ">= 0.01"]),
    ("clock_drift", {"speed": 2}, ["unknown parameter(s) speed", "rate_ppm", "update_s"]),
])
def test_bad_params_name_the_fault_and_the_allowed_values(kind, params, names):
    with pytest.raises(FaultSpecError) as raised:
        validate_spec(spec(kind, **params))
    message = str(raised.value)
    assert message.startswith("fault 'skew1': ")
    for name in names:
        assert name in message, message


@pytest.mark.parametrize("target", ["kafka", "node:kafka", "storage", "node:s3"])
def test_roles_libfaketime_cannot_reach_are_refused_at_load(target):
    with pytest.raises(FaultSpecError) as raised:
        validate_spec(spec("clock_offset", target=target))
    message = str(raised.value)
    assert "skew1" in message and target in message
    assert ("static-pie" in message) if "kafka" in target else ("S3 stand-in" in message)
    assert "broker:N" in message and "redis-" in message  # what it reaches


@pytest.mark.parametrize("target", ["broker:2", "broker-random", "broker-minority", "broker-holding:c1",
                                    "redis-master-of:c1", "redis-random-replica", "node:redis-7001"])
def test_reachable_targets_are_accepted(target):
    assert validate_spec(spec("clock_jump", target=target)).target == target


def test_containers_refuse_clock_faults_and_external_targets_take_them():
    for kind in CLOCK_KINDS:
        assert provider_supports("local", kind)
        assert not provider_supports("containers", kind)
        assert "libfaketime" in PROVIDER_GAPS["containers"][kind]
        # The harness starts an external target's nodes, under libfaketime when the plan has a clock fault.
        assert external_refusal(kind, ("broker-random",), [{}], (("mosquitto", "broker"),)) == ""
        assert external_refusal(kind, ("node:mosquitto",), [{}], (("mosquitto", "broker"),)) == ""


def test_offset_file_contents_of_each_kind():
    assert file_contents("clock_offset", {"offset_s": 90.0}, 0.0, 10) == ["+90.000000\n", "+0.000000\n"]
    assert file_contents("clock_jump", {"delta_s": -30.0, "instant": False}, 2.0, 10) == [
        "-28.000000\n", "+2.000000\n"]
    # instant: the jump stays, heal writes the jumped value (no change)
    assert file_contents("clock_jump", {"delta_s": 10.0, "instant": True}, 0.0, 5) == ["+10.000000\n", "+10.000000\n"]
    strobe = {"offset_a_s": -1.0, "offset_b_s": 4.0, "period_s": 1.0}
    assert file_contents("clock_strobe", strobe, 0.0, 3.5) == [
        "-1.000000\n", "+4.000000\n", "-1.000000\n", "+4.000000\n", "+0.000000\n"]
    drift = {"rate_ppm": 100000.0, "update_s": 0.5}
    assert file_contents("clock_drift", drift, 0.0, 2.0) == [
        "+0.000000\n", "+0.050000\n", "+0.100000\n", "+0.150000\n", "+0.000000\n"]
    assert file_contents("clock_drift", {"rate_ppm": -1e6, "update_s": 1.0}, 5.0, 3.0)[-2:] == [
        "+3.000000\n", "+5.000000\n"]


def test_schedules():
    assert change_times("clock_offset", {"offset_s": 1.0}, 60) == [0.0]
    assert change_times("clock_strobe", {"period_s": 2.0, "offset_a_s": 0, "offset_b_s": 1}, 5.0) == [0.0, 2.0, 4.0]
    strobe = {"offset_a_s": 0.0, "offset_b_s": 7.0, "period_s": 0.5}
    assert [planned_offset("clock_strobe", strobe, 1.0, t) for t in (0, 0.49, 0.5, 1.0, 1.6)] == [1, 1, 8, 1, 8]
    assert planned_offset("clock_drift", {"rate_ppm": 2000.0}, 0.0, 100.0) == pytest.approx(0.2)
    with pytest.raises(ValueError, match="not a clock fault kind"):
        planned_offset("process_kill", {}, 0.0, 0.0)


def test_which_roles_a_plan_preloads():
    def slot(kind, target):
        return FaultSlot("f", kind, target, 0.0, 1.0, {})

    assert planned_clock_roles([slot("process_kill", "broker:1")]) == set()
    assert planned_clock_roles([slot("clock_offset", "broker-random")]) == {"broker"}
    assert planned_clock_roles([slot("clock_drift", "redis-master-of:c"), slot("clock_jump", "node:broker-2")]) == {
        "broker", "redis"}
    assert planned_clock_roles([{"kind": "clock_strobe", "target": "node:redis-7002"}]) == {"redis"}


def test_offset_file_format_and_reading(tmp_path):
    assert format_offset(1.5) == "+1.500000\n" and format_offset(-30) == "-30.000000\n" and format_offset(0) == "+0.000000\n"
    assert parse_offset("+1.5\n") == 1.5 and parse_offset("-30") == -30.0
    for bad in ("", "1.5", "@2030-01-01 00:00:00"):
        with pytest.raises(ValueError):
            parse_offset(bad)
    with pytest.raises(ValueError, match="outside"):
        format_offset(1e12)
    clock = ClockFile(tmp_path / "broker-1")
    clock.write(-2.25)
    assert clock.read() == -2.25 and not list(tmp_path.glob(".*.tmp"))


def test_clock_setup_preloads_only_its_roles(tmp_path):
    setup = ClockSetup(tmp_path / "clock", frozenset({"broker"}))
    assert setup.env_for("redis-7001", "redis") is None
    env = setup.env_for("broker-1", "broker")
    assert env["LD_PRELOAD"].endswith("libfaketimeMT.so.1")
    assert env["FAKETIME_NO_CACHE"] == "1" and env["FAKETIME_DONT_FAKE_MONOTONIC"] == "1"
    assert ClockFile(tmp_path / "clock" / "broker-1").read() == 0.0

    class Node:
        pass

    node = Node()
    assert offset_file_of(node) is None
    node.env = env
    assert offset_file_of(node) == tmp_path / "clock" / "broker-1"


def test_seen_offset_brackets_the_reading():
    seen = seen_offset(100.0, 130.2, 100.4, "test")
    assert seen.offset_s == pytest.approx(30.0) and seen.error_s == pytest.approx(0.2)


def _target(tmp_path, provider="local", redis_server="auto", keeper=None):
    from types import SimpleNamespace

    made = []

    def topology_class(config, run_dir, broker_config):
        made.append(SimpleNamespace(clocks=None))
        return made[-1]

    return SimpleNamespace(keeper=keeper, topology=None if keeper else topology_class(None, None, None),
                           topology_class=topology_class, run_dir=tmp_path, _write_broker_config=None,
                           config=SimpleNamespace(provider=provider, redis_server=redis_server)), made


def _fake_redis(tmp_path, malloc: str):
    script = tmp_path / f"redis-{malloc}"
    script.write_text(f"#!/bin/sh\necho 'Redis server v=7.0.15 sha=0 malloc={malloc} bits=64'\n")
    script.chmod(0o755)
    return str(script)


def test_prepare_clocks_preloads_the_roles_and_replaces_a_kept_topology(tmp_path):
    from types import SimpleNamespace

    from faults.libfaketime import ClockError
    from harness.reference_target import ReferenceTarget

    broker_fault = SimpleNamespace(faults=[FaultSlot("f", "clock_jump", "broker:1", 0, 1, {})])
    redis_fault = SimpleNamespace(faults=[FaultSlot("f", "clock_drift", "redis-random-master", 0, 1, {})])
    target, made = _target(tmp_path)
    assert ReferenceTarget.prepare_clocks(target, SimpleNamespace(faults=[])) == []
    assert target.topology.clocks is None
    notes = ReferenceTarget.prepare_clocks(target, broker_fault)
    assert target.topology.clocks.roles == {"broker"} and "libfaketime" in notes[-1]

    kept, made = _target(tmp_path, keeper=object())
    notes = ReferenceTarget.prepare_clocks(kept, broker_fault)
    assert kept.keeper is None and kept.topology is made[-1] and kept.topology.clocks is not None
    assert "fresh topology" in notes[0]

    jemalloc, _ = _target(tmp_path, redis_server=_fake_redis(tmp_path, "jemalloc-5.3.0"))
    with pytest.raises(ClockError, match="jemalloc-5.3.0.*redis_server.*valkey-server"):
        ReferenceTarget.prepare_clocks(jemalloc, redis_fault)
    libc, _ = _target(tmp_path, redis_server=_fake_redis(tmp_path, "libc"))
    ReferenceTarget.prepare_clocks(libc, redis_fault)
    assert libc.topology.clocks.roles == {"redis"}

    containers, _ = _target(tmp_path, provider="containers")
    with pytest.raises(ClockError, match="containers provider"):
        ReferenceTarget.prepare_clocks(containers, broker_fault)
