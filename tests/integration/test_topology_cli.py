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
