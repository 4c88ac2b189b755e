"""The shrink search (ordeal/shrink.py) with an oracle in place of real runs: which candidates it accepts,
K-of-N, its stopping rules and outputs.  The oracle is a pure predicate on the plan, standing in for
"run it and check it" only to test the search itself; tests/integration/test_explore_planted.py shrinks
real runs."""

from __future__ import annotations

import itertools
import json
import threading
from pathlib import Path

import pytest

from contracts.scenario import find_scenario, load_scenario
from ordeal.replay import Played, load_stored_run
from ordeal.shrink import RoundPlayer, RunsRule, ShrinkError, ShrinkSettings, shrink
from properties.generate import make_plan
from properties.plan import Plan
from properties.reduction import validate_plan

TARGET = "order.dup_flag"
PAIR = {"test_pub_client_1_0", "test_sub_client_1_0"}


def report(failing: set[str]) -> dict:
    ids = [TARGET, "durability.lost"]
    return {"verdict": "fail" if failing else "pass",
            "invariants": [{"id": i, "verdict": "fail" if i in failing else "pass", "witnesses": []} for i in ids]}


@pytest.fixture
def stored(tmp_path):
    path = find_scenario("p2p-smoke")
    run = tmp_path / "original"
    run.mkdir()
    (run / "scenario.toml").write_text(path.read_text())
    (run / "plan.json").write_text(make_plan(load_scenario(path), 1).to_json())
    (run / "report.json").write_text(json.dumps(report({TARGET})))
    return load_stored_run(run)


def needs_pair_one(plan: Plan) -> bool:
    """The failure needs publisher 1 to publish to its subscriber at least once."""
    return {c.client_id for c in plan.clients} >= PAIR and any(
        p.publisher == "test_pub_client_1_0" for p in plan.publishes)


class Oracle:
    def __init__(self, fails, exit_code: int = 1):
        self.fails, self.exit_code, self.plans = fails, exit_code, []

    def __call__(self, plan: Plan, parent: Path, stop: threading.Event) -> Played:
        self.plans.append(plan)
        failing = self.fails(plan)
        run_dir = parent / f"run-{len(self.plans)}"
        return Played(run_dir, self.exit_code if failing else 0, report({TARGET} if failing else set()), 0.01, {})


def settings(**kwargs) -> ShrinkSettings:
    return ShrinkSettings(**{"max_attempts": 500, "budget_s": 600.0, **kwargs})


def test_shrinks_to_the_one_pair_and_one_publish_the_failure_needs(stored, tmp_path):
    oracle = Oracle(needs_pair_one)
    result = shrink(stored, settings(batch=1), tmp_path / "out", log=lambda line: None, player=oracle)
    assert result.stop_reason.startswith("minimal")
    assert {c.client_id for c in result.minimal.clients} == PAIR
    assert len(result.minimal.publishes) == 1 and result.minimal.publishes[0].seq == 1
    assert all(a.action == "connect" for a in result.minimal.subscriber_actions)  # no offline period left
    assert result.minimal.duration_s < stored.plan.duration_s
    assert validate_plan(result.minimal) == []
    assert all(needs_pair_one(plan) == attempt.accepted for plan, attempt in zip(oracle.plans, result.attempts,
                                                                                 strict=True))
    out = result.out_dir
    assert Plan.from_json((out / "shrunk-plan.json").read_text()) == result.minimal
    assert (out / "plan.json").read_text() == (out / "shrunk-plan.json").read_text()
    assert (out / "scenario.toml").read_text() == stored.scenario_path.read_text()
    log = json.loads((out / "shrink.json").read_text())
    assert log["minimal_size"]["clients"] == 2 and len(log["attempts"]) == len(result.attempts)
    assert load_stored_run(out).plan == result.minimal  # the result directory is replayable


def test_k_of_n_stops_early_either_way(stored, tmp_path):
    always = shrink(stored, settings(runs=RunsRule(2, 3), max_attempts=3, batch=1), tmp_path / "a", log=lambda line: None,
                    player=Oracle(lambda plan: True))
    assert [a.runs for a in always.attempts] == [2, 2, 2] and all(a.accepted for a in always.attempts)
    never = shrink(stored, settings(runs=RunsRule(2, 3), max_attempts=3, batch=1), tmp_path / "n", log=lambda line: None,
                   player=Oracle(lambda plan: False))
    assert [a.runs for a in never.attempts] == [2, 2, 2] and not any(a.accepted for a in never.attempts)
    assert never.minimal == stored.plan


def test_a_flaky_failure_is_accepted_by_two_of_three_but_not_by_one_of_one(stored, tmp_path):
    flips = itertools.cycle([False, True])  # pass, fail, pass, fail, ...
    result = shrink(stored, settings(runs=RunsRule(1, 1), max_attempts=1), tmp_path / "a", log=lambda line: None,
                    player=Oracle(lambda plan: next(flips)))
    assert not result.attempts[0].accepted
    flips = itertools.cycle([False, True])
    result = shrink(stored, settings(runs=RunsRule(1, 2), max_attempts=1), tmp_path / "b", log=lambda line: None,
                    player=Oracle(lambda plan: next(flips)))
    assert result.attempts[0].accepted and result.attempts[0].runs == 2


def test_unknown_runs_never_count_as_failures(stored, tmp_path):
    result = shrink(stored, settings(max_attempts=4), tmp_path / "u", log=lambda line: None,
                    player=Oracle(lambda plan: True, exit_code=2))
    assert not any(a.accepted for a in result.attempts) and result.minimal == stored.plan


def test_stopping_rules(stored, tmp_path):
    capped = shrink(stored, settings(max_attempts=2), tmp_path / "m", log=lambda line: None,
                    player=Oracle(lambda plan: False))
    assert len(capped.attempts) == 2 and "--max-attempts 2" in capped.stop_reason
    broke = shrink(stored, settings(budget_s=10), tmp_path / "b", log=lambda line: None,
                   player=Oracle(lambda plan: True))
    assert broke.attempts == [] and broke.stop_reason.startswith("budget:")
    assert Plan.from_json((broke.out_dir / "shrunk-plan.json").read_text()) == stored.plan


def test_bad_input_is_refused_with_the_reason(stored, tmp_path):
    with pytest.raises(ShrinkError, match="did not fail it"):
        shrink(stored, settings(target=frozenset({"durability.lost"})), tmp_path, player=Oracle(bool))
    (stored.directory / "report.json").write_text(json.dumps(report(set())))
    with pytest.raises(ShrinkError, match="nothing to shrink"):
        shrink(load_stored_run(stored.directory), settings(), tmp_path, player=Oracle(bool))
    (stored.directory / "report.json").unlink()
    with pytest.raises(ShrinkError, match="no report.json"):
        shrink(load_stored_run(stored.directory), settings(), tmp_path, player=Oracle(bool))


class UncheckedRuns(RoundPlayer):
    """Plays nothing real: each run comes back unchecked (report None, like ``play(..., check=False)``); the
    check (``check_runs``) is the oracle, called once per round with the round's run directories."""

    def __init__(self, stored, settings, fails):
        self.fails, self.plans = fails, {}
        super().__init__(stored.scenario_path, settings, check_runs=self._check)

    def run(self, plan, parent, stop):
        run_dir = parent / f"run-{len(self.plans) + 1}"
        self.plans[run_dir] = plan
        return Played(run_dir, 0, None, 0.01, {"history_complete": True})

    def _check(self, run_dirs, spark_master):
        class Checked:
            def __init__(self, failing):
                self.exit_code, self.report, self.summary = (1 if failing else 0), report(
                    {TARGET} if failing else set()), {"checked": True}
        return [Checked(self.fails(self.plans[d])) for d in run_dirs]


def test_each_round_is_checked_in_one_call_and_the_minimal_plan_is_the_one_by_one_result(stored, tmp_path):
    one_by_one = shrink(stored, settings(batch=1), tmp_path / "one", log=lambda line: None,
                        player=Oracle(needs_pair_one))
    rounds = UncheckedRuns(stored, settings(batch=4), needs_pair_one)
    batched = shrink(stored, settings(batch=4), tmp_path / "four", log=lambda line: None, round_player=rounds)
    assert batched.minimal == one_by_one.minimal and batched.stop_reason == one_by_one.stop_reason
    # one check call per round of up to 4 runs, never one per run
    assert rounds.check_calls == batched.check_calls and max(rounds.check_calls) == 4
    assert len(rounds.check_calls) < len(batched.attempts) and sum(rounds.check_calls) == len(batched.attempts)
    log = json.loads((batched.out_dir / "shrink.json").read_text())
    assert log["check_calls"] == rounds.check_calls and log["batch"] == 4
    # the taken attempts are the same plans, in the same order, as one by one
    assert ([a.size for a in batched.attempts if a.accepted] == [a.size for a in one_by_one.attempts if a.accepted])


def test_k_of_n_in_rounds_runs_only_the_undecided_candidates_again(stored, tmp_path):
    flips = itertools.cycle([False, True])  # every candidate: pass, then fail
    rounds = UncheckedRuns(stored, settings(batch=3, runs=RunsRule(1, 2), max_attempts=3), lambda plan: next(flips))
    result = shrink(stored, settings(batch=3, runs=RunsRule(1, 2), max_attempts=3), tmp_path / "k",
                    log=lambda line: None, round_player=rounds)
    # pass 1: three runs, one check -> candidate 2 fails (accepted), 1 and 3 pass; pass 2: only candidate 1
    # (before the accepted one) runs again -> it fails, so it wins: the same winner as one by one.
    assert rounds.check_calls == [3, 1]
    assert [(a.accepted, a.matched, a.runs) for a in result.attempts] == [(True, 1, 2), (False, 1, 1), (False, 0, 1)]
