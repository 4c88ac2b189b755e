"""`ordeal up --check` end to end, as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def _up(tmp_path: Path, *args: str) -> tuple[int, dict, str]:
    result = subprocess.run([sys.executable, "-m", "ordeal.cli", "up", "--check", "--run-dir",
                             str(tmp_path / "run"), *args], cwd=REPO, capture_output=True, text=True, timeout=120)
    return result.returncode, json.loads(result.stdout) if result.stdout.strip() else {}, result.stderr


def test_check_with_a_scenario_is_healthy_within_30_s(tmp_path: Path) -> None:
    code, summary, stderr = _up(tmp_path, "--scenario", str(REPO / "scenarios" / "p2p-smoke.toml"))
    assert code == 0, (summary, stderr)
    assert summary["healthy"] is True
    assert summary["redis"] == {**summary["redis"], "ok": True, "masters": 3, "replicas": 3, "problems": []}
    assert summary["kafka"]["ok"] and summary["kafka"]["committed"] == summary["kafka"]["offset"] + 1
    assert summary["brokers"]["ok"] and list(summary["brokers"]["nodes"]) == ["broker-1"]
    assert summary["timings"]["total_s"] < 30
    written = json.loads((tmp_path / "run" / "topology.json").read_text())
    assert written["redis"]["startup_nodes"] == summary["endpoints"]["redis"]["startup_nodes"]
    print(f"\nordeal up --check --scenario p2p-smoke: {summary['timings']}")


def test_check_reports_a_start_up_failure_as_unhealthy(tmp_path: Path) -> None:
    scenario = tmp_path / "missing-binary.toml"
    scenario.write_text((REPO / "scenarios" / "p2p-smoke.toml").read_text().replace(
        "[topology]\n", "[topology]\nredis_server = \"/nonexistent/redis-server\"\n"))
    code, summary, stderr = _up(tmp_path, "--scenario", str(scenario))
    assert code == 1
    assert summary["healthy"] is False and "redis_server = '/nonexistent/redis-server'" in summary["error"]


def test_check_default_starts_two_brokers_and_passes_mqtt_through_them(tmp_path: Path) -> None:
    import time

    began = time.monotonic()
    code, summary, stderr = _up(tmp_path)
    wall_s = time.monotonic() - began
    assert code == 0, (summary, stderr)
    assert summary["healthy"] is True
    mqtt = summary["endpoints"]["mqtt"]
    assert list(mqtt) == ["broker-1", "broker-2"] and len(set(mqtt.values())) == 2
    assert summary["brokers"]["ok"] and summary["brokers"]["nodes"] == mqtt
    # QoS 1 published on the first node, stored for the offline persistent subscriber on the second
    check = summary["mqtt"]
    assert check["ok"] and check["session_present"] and len(check["received"]) == 1, check
    assert (check["publish_to"], check["subscribe_on"]) == (mqtt["broker-1"], mqtt["broker-2"])
    assert summary["timings"]["total_s"] < 30 and wall_s < 30
    written = json.loads((tmp_path / "run" / "topology.json").read_text())
    assert written["config"]["broker_nodes"] == 2 and written["mqtt"] == mqtt
    print(f"\nordeal up --check (2 brokers): {summary['timings']}, mqtt {check}, wall {wall_s:.1f} s")


def test_check_is_unhealthy_when_the_mqtt_round_trip_is_wrong(tmp_path: Path) -> None:
    # a planted defect: CONNACK says session present = 0 although the stored session resumed
    scenario = tmp_path / "defect.toml"
    scenario.write_text((REPO / "scenarios" / "p2p-smoke.toml").read_text()
                        + '\n[broker]\ndefects = ["session_present_always_zero"]\n')
    code, summary, stderr = _up(tmp_path, "--scenario", str(scenario), "--brokers", "2")
    assert code == 1, (summary, stderr)
    assert summary["healthy"] is False and summary["redis"]["ok"] and summary["brokers"]["ok"]
    assert summary["mqtt"]["ok"] is False and summary["mqtt"]["session_present"] is False
    assert list(summary["endpoints"]["mqtt"]) == ["broker-1", "broker-2"]  # --brokers beat the scenario's 1


def test_check_without_brokers(tmp_path: Path) -> None:
    code, summary, stderr = _up(tmp_path, "--brokers", "0")
    assert code == 0, (summary, stderr)
    assert summary["endpoints"]["mqtt"] == {} and "mqtt" not in summary and "brokers" not in summary
    code, _, stderr = _up(tmp_path / "none", "--brokers", "-1")
    assert code == 3 and "--brokers" in stderr
