"""`ordeal shrink` reduces a run that fails because of a planted catalog defect (dup_on_first_delivery →
order.dup_flag, shows without faults) to a smaller valid plan that still fails it.  Real runs, tiny
scenario (tests/data/shrink-dup-defect.toml), at most 3 candidates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ordeal.cli import main
from ordeal.replay import play, read_report
from ordeal.scenario import load_scenario
from properties.generate import make_plan
from properties.plan import Plan
from properties.shrink import plan_size, validate_plan

pytestmark = pytest.mark.integration

SCENARIO = Path(__file__).resolve().parents[1] / "data" / "shrink-dup-defect.toml"
TARGET = "order.dup_flag"


def test_shrink_reduces_a_planted_defect_failure(tmp_path):
    plan = make_plan(load_scenario(SCENARIO), 1)
    original = play(SCENARIO, plan, tmp_path / "runs")
    assert original.exit_code == 1 and TARGET in original.failing, original.run_dir

    result = CliRunner().invoke(main, ["shrink", str(original.run_dir), "--invariant", TARGET, "--max-attempts",
                                       "3", "--budget", "5m", "--out", str(tmp_path / "shrinks")])
    assert result.exit_code == 0, result.output
    assert "attempt   1" in result.output and "replay: ordeal replay" in result.output
    out_dir = next((tmp_path / "shrinks").iterdir())
    shrunk = Plan.from_json((out_dir / "shrunk-plan.json").read_text())
    assert (out_dir / "plan.json").read_text() == (out_dir / "shrunk-plan.json").read_text()
    assert validate_plan(shrunk) == []
    before, after = plan_size(plan), plan_size(shrunk)
    assert after.clients <= before.clients and after.publishes <= before.publishes
    assert after.publishes + after.clients < before.publishes + before.clients, (before, after)

    log = json.loads((out_dir / "shrink.json").read_text())
    assert 1 <= len(log["attempts"]) <= 3 and log["target"] == [TARGET]
    accepted = [a for a in log["attempts"] if a["accepted"]]
    assert accepted, log["attempts"]
    for attempt in log["attempts"]:  # accepted exactly when its run failed the target
        assert attempt["accepted"] == (attempt["exit_codes"][0] == 1 and TARGET in attempt["failing"][0])
    last = Path(accepted[-1]["run_dirs"][0])
    assert Plan.from_json((last / "plan.json").read_text()) == shrunk
    assert TARGET in {i["id"] for i in read_report(out_dir)["invariants"] if i["verdict"] == "fail"}
    assert log["replay"] == f"ordeal replay {out_dir}"
