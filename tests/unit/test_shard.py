"""ordeal/shard.py and ``--shard K/N``: the text form, explore's seeds per shard (disjoint, covering, with and
without --seed-start and the corpus's next-seed rule, through the real explore loop), the self-test's units of
the shipped matrix in both tiers (disjoint, covering, a defect's seeds never split), and a bad --shard as a
usage error through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from contracts.exit_codes import EXIT_USAGE
from ordeal import explore as explore_module
from ordeal.cli import main
from ordeal.explore import ExploreSettings, explore, start_seed
from ordeal.replay import Played
from ordeal.selftest.matrix import load_matrix
from ordeal.selftest.tier import plan_jobs
from ordeal.shard import WHOLE, Shard, ShardError, assign_units, selftest_units, shard_jobs, shard_record

SHRINK_SCENARIO = Path(__file__).resolve().parents[1] / "data" / "shrink-dup-defect.toml"
NS = (1, 2, 3, 4)


@pytest.mark.parametrize("text, shard", [("1/1", Shard(1, 1)), ("2/4", Shard(2, 4)), (" 4 / 4 ", Shard(4, 4))])
def test_shard_text_parses(text, shard):
    assert Shard.parse(text) == shard and str(shard) == f"{shard.k}/{shard.n}"


@pytest.mark.parametrize("text", ["0/4", "5/4", "2/0", "0/0", "2", "a/b", "-1/3", "", "2/4/1", "2:4", "1.0/2"])
def test_bad_shard_text_is_refused_naming_the_option_and_the_form(text):
    with pytest.raises(ShardError, match=r"--shard .*expected K/N, e\.g\. 2/4"):
        Shard.parse(text)


def test_a_stored_shard_record_is_checked_naming_its_file():
    assert Shard.from_dict({"k": 2, "n": 3}, "x.json") == Shard(2, 3)
    for bad in ({"k": 4, "n": 3}, {"k": "1", "n": 3}, {"k": True, "n": 1}, None, {"n": 2}):
        with pytest.raises(ShardError, match="x.json: shard record"):
            Shard.from_dict(bad, "x.json")


def _explore_seeds(shard: Shard, start: int, stop: int) -> set[int]:
    seeds = set()
    for seed in shard.seeds_from(start):
        if seed >= stop:
            return seeds
        seeds.add(seed)
    raise AssertionError("unreachable")


@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("start", [0, 1, 2, 7, 100])
def test_explore_seed_sets_are_disjoint_and_cover_the_range(n, start):
    sets = [_explore_seeds(Shard(k, n), start, start + 41) for k in range(1, n + 1)]
    assert set().union(*sets) == set(range(start, start + 41))
    assert sum(len(s) for s in sets) == 41  # disjoint
    for k, seeds in enumerate(sets, 1):
        assert all(s % n == k - 1 for s in seeds)


@pytest.mark.parametrize("n", NS)
def test_start_seed_with_seed_start_and_with_the_corpus_rule(tmp_path, n):
    # --seed-start 5: each shard's first seed is its first at or after 5, and together the first n seeds are 5..
    firsts = {start_seed(ExploreSettings(1, tmp_path, tmp_path, seed_start=5, shard=Shard(k, n)), "s")
              for k in range(1, n + 1)}
    assert firsts == set(range(5, 5 + n))
    # the corpus rule: after the highest seed explored (9, of this scenario), each shard's next seed of its own
    (tmp_path / "explored.jsonl").write_text('{"scenario": "s", "seed": 9}\n{"scenario": "t", "seed": 50}\n')
    firsts = [start_seed(ExploreSettings(1, tmp_path, tmp_path, shard=Shard(k, n)), "s") for k in range(1, n + 1)]
    assert sorted(firsts) == list(range(10, 10 + n)) and all(f > 9 and f % n == k - 1 for k, f in enumerate(firsts, 1))


def _stub_play(seen: list[int], runs: int):
    """Stands in for ``ordeal.replay.play`` (one scenario run on a broker): records the seed it was asked
    for and ends the exploration (SIGINT) on the call after ``runs``; the loop's seed sequence is what is tested."""
    def play(scenario_path, plan, out, **_):
        if len(seen) == runs:
            raise KeyboardInterrupt
        seen.append(plan.seed)
        return Played(Path(out) / f"run-{plan.seed}", 0, {"verdict": "pass", "invariants": []}, 1.0,
                      {"history_complete": True})
    return play


@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("seed_start", [None, 3])
def test_the_explore_loop_runs_each_shards_own_seeds(tmp_path, monkeypatch, n, seed_start):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "explored.jsonl").write_text('{"scenario": "shrink-dup-defect", "seed": 6}\n')
    per_shard = []
    for k in range(1, n + 1):
        seen: list[int] = []
        monkeypatch.setattr(explore_module, "play", _stub_play(seen, 5))
        settings = ExploreSettings(budget_s=10_000, corpus=corpus, out=tmp_path / f"out-{k}", seed_start=seed_start,
                                   overlap_checks=False, keep_topology=False, shard=Shard(k, n))
        result = explore(SHRINK_SCENARIO, settings, log=lambda line: None)
        assert [r.seed for r in result.runs] == seen and len(seen) == 5
        per_shard.append(seen)
        lines = (corpus / "explored.jsonl").read_text().splitlines()
        (corpus / "explored.jsonl").write_text(lines[0] + "\n")  # every shard starts from the same corpus
    first = 3 if seed_start is not None else 7
    together = sorted(s for seen in per_shard for s in seen)
    assert together == list(range(first, first + 5 * n))  # disjoint, and no seed skipped
    for k, seen in enumerate(per_shard, 1):
        assert seen == sorted(seen) and all(s % n == k - 1 for s in seen)


@pytest.fixture(scope="module")
def matrix():
    return load_matrix()


@pytest.mark.parametrize("tier", ["smoke", "full"])
@pytest.mark.parametrize("n", NS)
def test_selftest_units_of_the_shipped_matrix_are_disjoint_and_cover_the_tier(matrix, tier, n):
    planned = plan_jobs(matrix, tier)
    shards = [shard_jobs(planned, Shard(k, n)) for k in range(1, n + 1)]
    labels = [job.label for jobs in shards for job in jobs]
    assert sorted(labels) == sorted(job.label for job in planned) and len(labels) == len(set(labels))
    where = {job.label: k for k, jobs in enumerate(shards) for job in jobs}
    for jobs in shards:
        assert jobs == [job for job in planned if job in jobs]  # plan order kept
    by_entry: dict[str, set[int]] = {}
    for job in planned:
        if job.role == "defect":
            by_entry.setdefault(job.defect, set()).add(where[job.label])
    assert all(len(ks) == 1 for ks in by_entry.values())  # an entry's seeds never straddle shards
    # a correct run goes with the first entry of its scenario and seed
    for job in planned:
        if job.role == "correct":
            owner = next(j for j in planned if j.role == "defect" and (j.scenario, j.seed) == (job.scenario, job.seed))
            assert where[job.label] == where[owner.label]
    if tier == "full":
        assert {j.role for j in planned} >= {"defect", "correct", "false_alarm", "blackbox"}


def test_units_group_an_entry_and_single_out_repeats_and_blackbox_runs(matrix):
    planned = plan_jobs(matrix, "full", repeat=2)
    units = selftest_units(planned)
    assert sorted(j.label for unit in units for j in unit) == sorted(j.label for j in planned)
    for unit in units:
        roles = {j.role for j in unit}
        if roles & {"false_alarm", "blackbox"}:
            assert len(unit) == 1
        else:
            assert "defect" in roles and len({j.defect for j in unit if j.role == "defect"}) == 1
    entries = {j.defect for j in planned if j.role == "defect"}
    assert sum(1 for unit in units if unit[0].role == "defect") == len(entries)


def test_units_are_dealt_to_the_least_loaded_shard_in_order():
    assert assign_units([10, 10, 1, 1, 1], 2) == [0, 1, 0, 1, 0]
    assert assign_units([5, 1, 1, 1, 1], 2) == [0, 1, 1, 1, 1]
    assert assign_units([3, 3], 4) == [0, 1]  # shards 3 and 4 get nothing
    assert assign_units([], 3) == []


def test_the_whole_is_shard_one_of_one(matrix):
    planned = plan_jobs(matrix, "smoke")
    assert shard_jobs(planned, WHOLE) == planned
    assert shard_record(Shard(2, 3), planned) == {"k": 2, "n": 3, "planned": [j.label for j in planned]}


@pytest.mark.parametrize("command", [["explore", "p2p-smoke"], ["selftest"]])
@pytest.mark.parametrize("text", ["0/4", "5/4", "two"])
def test_bad_shard_on_the_cli_is_a_usage_error_naming_the_option(command, text):
    result = CliRunner().invoke(main, [*command, "--shard", text])
    assert result.exit_code == EXIT_USAGE
    assert "--shard" in result.output and "K/N, e.g. 2/4" in result.output


def test_an_explore_out_of_another_shard_is_refused_before_exploring(tmp_path):
    (tmp_path / "explore-summary.json").write_text(json.dumps(
        {"schema_version": 1, "kind": "explore", "shard": {"k": 1, "n": 2}, "explorations": []}))
    result = CliRunner().invoke(main, ["explore", str(SHRINK_SCENARIO), "--shard", "2/2", "--out", str(tmp_path),
                                       "--corpus", str(tmp_path / "corpus"), "--budget", "1s"])
    assert result.exit_code == EXIT_USAGE and "not --shard 2/2" in result.output
