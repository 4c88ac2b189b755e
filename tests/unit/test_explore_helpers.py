"""Pure parts of replay / shrink / explore: option parsing, verdict comparison, budget estimate, corpus files,
promotion.  The real runs are in tests/integration/test_explore_planted.py and test_shrink_planted.py."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest

from contracts.scenario import find_scenario, load_scenario
from ordeal.commands.durations import parse_duration
from ordeal.explore import (
    FIRST_RUN_OVERHEAD_S,
    BackgroundChecker,
    ExploredRun,
    ExploreError,
    ExploreResult,
    ExploreSettings,
    estimate_run_s,
    explore,
    next_seed,
    promote,
    summary_lines,
)
from ordeal.pipeline import Checked
from ordeal.replay import Played, StoredRunError, compare, comparison_lines, first_witness, load_stored_run
from ordeal.shrink import RunsRule, ShrinkError
from properties.generate import make_plan

SHRINK_SCENARIO = Path(__file__).resolve().parents[1] / "data" / "shrink-dup-defect.toml"


def report(**verdicts: str) -> dict:
    return {"invariants": [{"id": k.replace("_", ".", 1), "verdict": v,
                            "witnesses": [{"text": f"witness of {k}"}] if v == "fail" else []}
                           for k, v in verdicts.items()]}


def test_parse_duration():
    assert parse_duration("90") == 90
    assert parse_duration("90s") == 90
    assert parse_duration("10m") == 600
    assert parse_duration("1h30m") == 5400
    for bad in ("", "ten", "0s", "5x"):
        with pytest.raises(click.BadParameter):
            parse_duration(bad)


def test_runs_rule():
    assert RunsRule.parse("2/3") == RunsRule(2, 3)
    for bad in ("3/2", "0/1", "a/b", "1", "1/50"):
        with pytest.raises(ShrinkError, match="--runs"):
            RunsRule.parse(bad)


def test_comparison_agrees_only_on_the_same_failing_invariants():
    a = report(order_dup="fail", durability_lost="pass")
    assert compare(a, report(order_dup="fail", durability_lost="pass")).agree
    other = compare(a, report(order_dup="fail", durability_lost="fail"))
    assert not other.agree and other.only_replay == {"durability.lost"}
    assert not compare(a, report(order_dup="pass", durability_lost="pass")).agree
    passing = report(order_dup="pass", durability_lost="pass")
    assert not compare(passing, report(order_dup="pass", durability_lost="unknown")).agree  # unknown != pass
    assert not compare(None, a).agree
    lines = comparison_lines(other)
    assert any("durability.lost" in line and "differs" in line for line in lines)
    assert lines[-1].startswith("agreement: DISAGREE")
    assert comparison_lines(compare(None, a))[-1].startswith("agreement: unknown")


def test_first_witness_is_from_the_first_failing_invariant():
    found = first_witness(report(order_dup="pass", durability_lost="fail", limits_over="fail"))
    assert found["invariant"] == "durability.lost" and found["witness"]["text"] == "witness of durability_lost"
    assert first_witness(report(order_dup="pass")) is None


def test_budget_estimate_uses_the_worst_measured_overhead():
    assert estimate_run_s(3, 1, []) == 3 + 1 + FIRST_RUN_OVERHEAD_S
    assert estimate_run_s(3, 1, [12.0, 20.0, 15.0]) == 23.0
    # Overlapped checks: the last run's check must fit too (the first-run guess until one was measured).
    assert estimate_run_s(3, 1, [], []) == 3 + 1 + FIRST_RUN_OVERHEAD_S
    assert estimate_run_s(3, 1, [5.0], []) == 3 + 5 + FIRST_RUN_OVERHEAD_S
    assert estimate_run_s(3, 1, [5.0, 6.0], [9.0, 4.0]) == 3 + 6 + 9


def test_background_checker_batches_what_queued_and_keeps_the_order(tmp_path):
    import threading

    gate, calls = threading.Event(), []

    def check(dirs):
        calls.append([d.name for d in dirs])
        gate.wait(10)  # the first check is still running while more runs finish
        return [Checked(d, {"invariants": []}, {"exit_code": 0, "checked": True}, 0) for d in dirs]

    checker = BackgroundChecker(check=check)
    played = [Played(tmp_path / f"r{i}", 2, None, 10.0, {"history_complete": True}) for i in range(4)]
    checker.submit(played[0], "plan0")
    while not calls:
        threading.Event().wait(0.01)
    for i in (1, 2, 3):
        checker.submit(played[i], f"plan{i}")
    assert checker.pending() == 4
    gate.set()
    done = checker.close()
    assert calls == [["r0"], ["r1", "r2", "r3"]]  # the three that queued meanwhile: one job
    assert [plan for _, plan in done] == ["plan0", "plan1", "plan2", "plan3"]
    assert all(p.exit_code == 0 and p.seconds == 10.0 for p, _ in done)
    assert [n for n, _ in checker.batches] == [1, 3]


def test_a_background_check_that_breaks_leaves_the_runs_unknown(tmp_path):
    def check(dirs):
        raise RuntimeError("no spark")

    checker = BackgroundChecker(check=check)
    checker.submit(Played(tmp_path / "r0", 2, None, 10.0, {"history_complete": True}), "plan")
    [(played, _)] = checker.close()
    assert played.exit_code == 2 and played.report is None
    assert "no spark" in played.summary["check"] and played.summary["checked"] is False


def test_next_seed_follows_the_corpus_log(tmp_path):
    assert next_seed(tmp_path, "s") == 1
    (tmp_path / "explored.jsonl").write_text('{"scenario": "s", "seed": 4}\n{"scenario": "t", "seed": 9}\n')
    assert next_seed(tmp_path, "s") == 5
    (tmp_path / "explored.jsonl").write_text("not json\n")
    with pytest.raises(ExploreError, match="explored.jsonl:1"):
        next_seed(tmp_path, "s")


def run(seed, code, failing=(), unknown=()):
    return ExploredRun(seed, code, f"/runs/{seed}", 10.0, 0, 0, tuple(failing), tuple(unknown), None)


def test_exit_code_and_summary_table():
    assert ExploreResult("s", [run(1, 0), run(2, 0)]).exit_code == 0
    assert ExploreResult("s", [run(1, 0), run(2, 2, unknown=["x"])]).exit_code == 2
    mixed = ExploreResult("s", [run(1, 2, unknown=["x"]), run(2, 1, ["order.dup_flag"])])
    assert mixed.exit_code == 1
    lines = summary_lines(mixed)
    assert "FAIL order.dup_flag" in lines[2]
    assert lines[-1].startswith("runs 2 ") and "unknowns 1" in lines[-1] and "exit 1" in lines[-1]
    assert "invariants failed 1 (order.dup_flag)" in lines[-1]
    assert ExploreResult("s").exit_code == 2  # nothing explored is no pass


def test_a_budget_too_small_for_one_run_starts_none(tmp_path):
    result = explore(SHRINK_SCENARIO, ExploreSettings(budget_s=15, corpus=tmp_path / "corpus", out=tmp_path / "runs"),
                     log=lambda line: None)
    assert result.runs == [] and result.stop_reason.startswith("budget:") and result.exit_code == 2
    assert not (tmp_path / "runs").exists()


def test_load_stored_run_errors_name_the_file(tmp_path):
    with pytest.raises(StoredRunError, match="not a directory"):
        load_stored_run(tmp_path / "missing")
    with pytest.raises(StoredRunError, match="scenario.toml: missing"):
        load_stored_run(tmp_path)
    (tmp_path / "scenario.toml").write_text("")
    (tmp_path / "plan.json").write_text("{")
    with pytest.raises(StoredRunError, match="plan.json: not valid JSON"):
        load_stored_run(tmp_path)


def test_promote_copies_an_entry_with_its_expectation(tmp_path):
    scenario_path = find_scenario("p2p-smoke")
    plan = make_plan(load_scenario(scenario_path), 3)
    entry = tmp_path / "corpus" / "p2p-smoke-3"
    entry.mkdir(parents=True)
    (entry / "scenario.toml").write_text(scenario_path.read_text())
    (entry / "plan.json").write_text(plan.to_json())
    (entry / "entry.json").write_text(json.dumps({"failing": ["order.dup_flag"], "first_witness": None}))
    target = promote(entry, tmp_path / "regressions")
    assert (target / "plan.json").read_text() == plan.to_json()
    assert json.loads((target / "expect.json").read_text())["invariants"] == ["order.dup_flag"]
    assert load_stored_run(target).plan == plan
    with pytest.raises(ExploreError, match="already promoted"):
        promote(entry, tmp_path / "regressions")
    with pytest.raises(ExploreError, match="not a corpus entry"):
        promote(tmp_path, tmp_path / "regressions")


def test_throughput_lines_say_where_the_overhead_goes_and_how_the_topology_was_kept():
    from dataclasses import replace

    from ordeal.explore import overhead_phases, throughput_lines

    summary = {"timings_s": {"target_start_s": 1.5, "workload_s": 10.0, "heal_all_s": 0.3, "drain_s": 2.0,
                             "target_stop_s": 0.4, "topology_reset_s": 0.1, "check_s": 20.0}}
    phases = overhead_phases(summary, 15.0, overlapped=True)
    assert dict(phases)["topology reset"] == 0.1 and dict(phases)["other"] == 0.7
    runs = [replace(run(seed, 0), seconds=15.0, phases=phases, check_overlapped=True, faults_applied=1,
                    topology="fresh" if seed == 1 else "kept") for seed in (1, 2, 3)]
    result = ExploreResult("s", runs, elapsed_s=45.0, topology_resets=[2.5, 3.5], topology_spares=1,
                           topology_fallbacks=["the reset after seed 1 on topology-1 failed: keys left"])
    lines = throughput_lines(result)
    assert lines[0].startswith("throughput: 240 runs/hour, 240 faulted runs/hour")
    assert lines[1] == "pace: a seed every 15.0 s -> 240 runs/hour while the checks keep up"
    assert lines[2].endswith("-> overhead 5.0 s per run (the check overlapped with the next seed)")
    assert lines[3].startswith("topology: kept (reset and verified) for 2 of 3 runs, 1 started fresh; 2 resets, "
                               "3.0 s each, in the background beside the next seed; given up 1 time(s): the reset")
