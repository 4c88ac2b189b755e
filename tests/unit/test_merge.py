"""``ordeal merge`` (ordeal/merge.py): the shards of a self-test merged equal the unsharded self-test (its
selftest.json, text table and JUnit), including a catch discounted only once the shards meet; explore shards
merged into one summary, one corpus and the JUnit files; one exit code; and the inputs it refuses (exit 3):
not a shard output, an unknown schema version, a missing or repeated shard, shards of different N.

The fixture is built the way ``ordeal selftest`` builds its outputs, without a broker: the shipped matrix's
full-tier plan, one synthetic report.json-shaped report per run, each judged (``judge``) and written by the
self-test's own writer (``write_outputs``), once whole and once per shard."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from contracts.exit_codes import EXIT_FAIL, EXIT_PASS, EXIT_UNKNOWN, EXIT_USAGE
from ordeal.cli import main
from ordeal.explore import ExploredRun, ExploreResult, ExploreSettings, write_summary
from ordeal.merge import MergeError, merge
from ordeal.selftest.judging import CAUGHT, UNKNOWN, SelftestResult, discount_shared_failures, judge
from ordeal.selftest.matrix import defect_catalog, load_matrix
from ordeal.selftest.outputs import result_document, text_table
from ordeal.selftest.runner import write_outputs
from ordeal.selftest.tier import plan_jobs
from ordeal.shard import WHOLE, Shard, selftest_units, shard_jobs, shard_record

MATRIX = load_matrix()
PLANNED = plan_jobs(MATRIX, "full", repeat=2)


def _report(failing=(), unknown=(), passing=()):
    invariants = ([{"id": i, "verdict": "fail", "witnesses": [{"text": f"witness of {i}", "data": {"t": 2_000_000}}]}
                   for i in failing] + [{"id": i, "verdict": "unknown", "why": "undecided"} for i in unknown]
                  + [{"id": i, "verdict": "pass"} for i in passing])
    verdict = "fail" if failing else "unknown" if unknown else "pass"
    return {"verdict": verdict, "invariants": invariants}


def _shared_pair():
    """Two entries on the same scenario and seed in different units: the correct run goes with the first; the
    second's catch is discounted when that correct run fails the second's invariant too."""
    units = selftest_units(PLANNED)
    unit_of = {job.label: index for index, unit in enumerate(units) for job in unit}
    for job in PLANNED:
        if job.role != "correct":
            continue
        others = [j for j in PLANNED if j.role == "defect" and (j.scenario, j.seed) == (job.scenario, job.seed)
                  and unit_of[j.label] != unit_of[job.label]]
        if others:
            return job, others[0]
    raise AssertionError("the shipped matrix has no two entries sharing a scenario (p2p-offline-backlog has)")


SHARED_CORRECT, SHARED_DEFECT = _shared_pair()
MISSED_DEFECT = next(j.defect for j in PLANNED if j.role == "defect" and j.defect != SHARED_DEFECT.defect)
FLAKY_REPEAT = next(j.label for j in PLANNED if j.role == "false_alarm")


def _report_for(job):
    if job.role == "defect":
        if job.defect == MISSED_DEFECT and job.seed % 2:  # caught on 2 of 5 seeds: missed
            return _report(passing=job.expect)
        return _report(failing=job.expect)
    if job is SHARED_CORRECT:
        return _report(failing=SHARED_DEFECT.expect)
    if job.label == FLAKY_REPEAT:
        return _report(unknown=("meta.history_complete",))
    if job.role == "blackbox":
        return _report(failing=("durability.lost",))
    return _report(passing=("durability.lost",))


def _write_selftest(out: Path, shard: Shard, *, check_s=None, total_s=None) -> SelftestResult:
    rows = discount_shared_failures([judge(job, _report_for(job), run_s=1.5, run_dir=None, replay=f"replay {job.label}")
                                     for job in shard_jobs(PLANNED, shard)])
    result = SelftestResult(tier="full", rows=rows, uncovered=MATRIX.uncovered(defect_catalog()), check_s=check_s,
                            total_s=total_s, shard=shard_record(shard, PLANNED))
    out.mkdir(parents=True)
    write_outputs(result, out, MATRIX)
    return result


def _shards(tmp_path: Path, n: int, name: str = "shard") -> list[Path]:
    dirs = []
    for k in range(1, n + 1):
        _write_selftest(tmp_path / f"{name}-{k}-of-{n}", Shard(k, n))
        dirs.append(tmp_path / f"{name}-{k}-of-{n}")
    return dirs


def _without_shard(document: dict) -> dict:
    return {key: value for key, value in document.items() if key != "shard"}


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_merged_selftest_shards_equal_the_unsharded_selftest(tmp_path, n):
    whole = _write_selftest(tmp_path / "whole", WHOLE)
    expected = json.loads((tmp_path / "whole" / "selftest.json").read_text())
    assert whole.exit_code == EXIT_FAIL  # the fixture has a missed defect: the merged verdict must keep it
    result = merge(_shards(tmp_path, n), tmp_path / "merged")
    merged = json.loads((tmp_path / "merged" / "selftest" / "selftest.json").read_text())
    assert _without_shard(merged) == _without_shard(expected)
    assert text_table(merged) == text_table(expected)
    assert (tmp_path / "merged" / "selftest" / "selftest-junit.xml").read_text() == \
        (tmp_path / "whole" / "selftest-junit.xml").read_text()
    assert (tmp_path / "merged" / "junit" / "selftest-junit.xml").is_file()
    assert merged["shard"]["merged"] == list(range(1, n + 1)) and merged["shard"]["n"] == n
    assert result.exit_code == EXIT_FAIL
    assert any(line.startswith("merged selftest shards " + ", ".join(f"{k}/{n}" for k in range(1, n + 1)))
               for line in result.lines)
    assert json.loads((tmp_path / "merged" / "merge.json").read_text())["selftest"]["shards"] == list(range(1, n + 1))


def test_a_catch_the_correct_broker_shares_on_another_shard_is_discounted_at_the_merge(tmp_path):
    n = next(n for n in (2, 3, 4) if shard_of(SHARED_CORRECT, n) != shard_of(SHARED_DEFECT, n))
    shard_dir = tmp_path / f"shard-{shard_of(SHARED_DEFECT, n)}-of-{n}"
    dirs = _shards(tmp_path, n)
    local = {r["label"]: r for r in json.loads((shard_dir / "selftest.json").read_text())["rows"]}
    assert local[SHARED_DEFECT.label]["outcome"] == CAUGHT  # alone, its shard cannot know
    merge(dirs, tmp_path / "merged")
    merged = {r["label"]: r for r in json.loads((tmp_path / "merged" / "selftest" / "selftest.json").read_text())["rows"]}
    assert merged[SHARED_DEFECT.label]["outcome"] == UNKNOWN and "correct broker" in merged[SHARED_DEFECT.label]["reason"]


def shard_of(job, n: int) -> int:
    return next(k for k in range(1, n + 1) if job in shard_jobs(PLANNED, Shard(k, n)))


def test_timings_add_up_over_the_shards_and_the_longest_shard_is_the_total(tmp_path):
    for k, (check, total) in enumerate(((10.0, 100.0), (5.5, 300.0)), 1):
        _write_selftest(tmp_path / f"s{k}", Shard(k, 2), check_s=check, total_s=total)
    merge([tmp_path / "s1", tmp_path / "s2"], tmp_path / "merged")
    merged = json.loads((tmp_path / "merged" / "selftest" / "selftest.json").read_text())
    assert merged["check_s"] == 15.5 and merged["total_s"] == 300.0


def test_an_unknown_schema_version_is_a_usage_error_naming_the_file(tmp_path):
    dirs = _shards(tmp_path, 2)
    path = dirs[1] / "selftest.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | {"schema_version": 99}))
    with pytest.raises(MergeError, match=r"shard-2-of-2/selftest\.json: schema_version 99 .*known: 1"):
        merge(dirs, tmp_path / "merged")
    result = CliRunner().invoke(main, ["merge", *map(str, dirs), "--out", str(tmp_path / "cli")])
    assert result.exit_code == EXIT_USAGE and "schema_version 99" in result.output


def test_a_missing_shard_is_a_usage_error_naming_what_was_expected(tmp_path):
    dirs = _shards(tmp_path, 3)
    with pytest.raises(MergeError, match=r"missing shard\(s\) 2/3; got 1/3 .*, 3/3 .*expected every shard K of 1\.\.3"):
        merge([dirs[0], dirs[2]], tmp_path / "merged")
    assert not (tmp_path / "merged").exists()  # nothing written
    result = CliRunner().invoke(main, ["merge", str(dirs[0]), str(dirs[2]), "--out", str(tmp_path / "cli")])
    assert result.exit_code == EXIT_USAGE and "missing shard(s) 2/3" in result.output


def test_a_repeated_shard_is_a_usage_error(tmp_path):
    dirs = _shards(tmp_path, 2)
    with pytest.raises(MergeError, match=r"shard-1-of-2: selftest shard 1/2 again"):
        merge([dirs[0], dirs[0], dirs[1]], tmp_path / "merged")


def test_shards_of_different_n_are_a_usage_error_naming_each_directory(tmp_path):
    two, three = _shards(tmp_path, 2), _shards(tmp_path, 3)
    with pytest.raises(MergeError, match=r"shards of different N: .*shard-1-of-2 is 1/2.*shard-2-of-3 is 2/3"):
        merge([two[0], *three[1:]], tmp_path / "merged")


def test_a_directory_that_is_not_a_shard_output_is_a_usage_error(tmp_path):
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    with pytest.raises(MergeError, match=r"empty: not a shard output: no selftest\.json or explore-summary\.json"):
        merge([tmp_path / "empty"], tmp_path / "merged")
    with pytest.raises(MergeError, match="missing: not a directory"):
        merge([tmp_path / "missing"], tmp_path / "merged")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "selftest.json").write_text('{"tier": "full"}')
    with pytest.raises(MergeError, match=r"bad/selftest\.json: no 'rows' list"):
        merge([tmp_path / "bad"], tmp_path / "merged")


def test_a_merged_output_is_not_merged_again(tmp_path):
    merge(_shards(tmp_path, 2), tmp_path / "merged")
    with pytest.raises(MergeError, match="already the output of `ordeal merge`"):
        merge([tmp_path / "merged" / "selftest"], tmp_path / "again")


def test_shards_of_other_plans_are_refused(tmp_path):
    dirs = _shards(tmp_path, 2)
    path = dirs[1] / "selftest.json"
    document = json.loads(path.read_text())
    document["shard"]["planned"] = document["shard"]["planned"][:-1]
    path.write_text(json.dumps(document))
    with pytest.raises(MergeError, match="planned other runs"):
        merge(dirs, tmp_path / "merged")


def test_an_unsharded_selftest_json_of_before_sharding_is_shard_one_of_one(tmp_path):
    whole = _write_selftest(tmp_path / "old", WHOLE)
    path = tmp_path / "old" / "selftest.json"
    document = json.loads(path.read_text())
    del document["shard"], document["schema_version"]
    path.write_text(json.dumps(document))
    result = merge([tmp_path / "old"], tmp_path / "merged")
    assert result.selftest.exit_code == whole.exit_code and len(result.selftest.rows) == len(whole.rows)


# ------------------------------------------------------------------------------------------------- explore
def _explored(scenario: str, seed: int, code: int, out: Path, failing=(), entry=None) -> ExploredRun:
    run_dir = out / f"{scenario}-{seed}-x"
    run_dir.mkdir(parents=True)
    (run_dir / "junit.xml").write_text(f"<testsuite name='seed {seed}'/>\n")
    return ExploredRun(seed, code, str(run_dir), 10.0, 1, 1, tuple(failing), ("undecided",) if code == 2 else (),
                       str(entry) if entry else None)


def _explore_shard(root: Path, shard: Shard, runs: dict[str, list[tuple[int, int]]]) -> Path:
    """A shard's tree as the nightly leaves it: explore/ (--out) and corpus/ (--corpus) side by side."""
    out, corpus = root / "explore", root / "corpus"
    corpus.mkdir(parents=True)
    for scenario, seeds in runs.items():
        explored = []
        for seed, code in seeds:
            entry = None
            if code == EXIT_FAIL:
                entry = corpus / f"{scenario}-{seed}"
                entry.mkdir()
                (entry / "entry.json").write_text(json.dumps({"seed": seed}))
            explored.append(_explored(scenario, seed, code, out, ("order.dup_flag",) if code == EXIT_FAIL else (), entry))
            with (corpus / "explored.jsonl").open("a") as handle:
                handle.write(json.dumps({"scenario": scenario, "seed": seed, "exit_code": code}) + "\n")
        result = ExploreResult(scenario, explored, stop_reason="budget", shard=shard, first_seed=seeds[0][0])
        write_summary(result, ExploreSettings(60, corpus, out, shard=shard), Path(f"scenarios/{scenario}.toml"))
    return root


def test_explore_shards_merge_into_one_summary_corpus_and_junit(tmp_path):
    # shard 1/2 runs the seeds s % 2 == 0, shard 2/2 the odd ones
    one = _explore_shard(tmp_path / "a", Shard(1, 2), {"chaos-mix": [(2, 0), (4, 1)], "session-mix": [(2, 0)]})
    two = _explore_shard(tmp_path / "b", Shard(2, 2), {"chaos-mix": [(1, 0), (3, 2)], "session-mix": [(1, 0)]})
    result = merge([one, two], tmp_path / "merged")  # each DIR holds explore/ one level down
    summary = json.loads((tmp_path / "merged" / "explore" / "explore-summary.json").read_text())
    chaos, mix = summary["explorations"]
    assert chaos["scenario"] == "chaos-mix" and chaos["seeds"] == [1, 2, 3, 4] and chaos["exit_code"] == EXIT_FAIL
    assert [r["shard"] for r in chaos["runs"]] == ["2/2", "1/2", "2/2", "1/2"]
    assert mix["seeds"] == [1, 2] and mix["exit_code"] == EXIT_PASS
    assert result.exit_code == EXIT_FAIL and summary["exit_code"] == EXIT_FAIL
    merged = tmp_path / "merged"
    assert (merged / "corpus" / "chaos-mix-4" / "entry.json").is_file()
    assert (merged / "explore" / chaos["failing_entries"][0]).resolve() == (merged / "corpus" / "chaos-mix-4").resolve()
    assert len((merged / "corpus" / "explored.jsonl").read_text().splitlines()) == 6
    assert sorted(p.name for p in (merged / "junit").iterdir()) == sorted(
        [f"chaos-mix-{s}-x.xml" for s in (1, 2, 3, 4)] + [f"session-mix-{s}-x.xml" for s in (1, 2)])
    assert "merged explore shards 1/2, 2/2" in "\n".join(result.lines)


def test_explore_exit_code_unknown_when_a_shard_did_not_explore_a_scenario(tmp_path):
    one = _explore_shard(tmp_path / "a", Shard(1, 2), {"chaos-mix": [(2, 0)], "session-mix": [(2, 0)]})
    two = _explore_shard(tmp_path / "b", Shard(2, 2), {"chaos-mix": [(1, 0)]})
    result = merge([one, two], tmp_path / "merged")
    assert result.exit_code == EXIT_UNKNOWN
    assert any("session-mix: shard(s) 2/2 did not explore it" in line for line in result.lines)
    both = _explore_shard(tmp_path / "c", Shard(2, 2), {"chaos-mix": [(1, 0)], "session-mix": [(3, 0)]})
    assert merge([one, both], tmp_path / "merged-2").exit_code == EXIT_PASS  # the near miss: every shard explored


def test_an_explore_seed_outside_its_shard_is_refused(tmp_path):
    one = _explore_shard(tmp_path / "a", Shard(1, 2), {"chaos-mix": [(2, 0)]})
    two = _explore_shard(tmp_path / "b", Shard(2, 2), {"chaos-mix": [(4, 0)]})  # 4 % 2 == 0: shard 1/2's
    with pytest.raises(MergeError, match=r"chaos-mix seed 4 is not a seed of shard 2/2 \(expected seeds s with s % 2 == 1\)"):
        merge([one, two], tmp_path / "merged")


def test_one_exit_code_over_selftest_and_explore(tmp_path):
    # a passing self-test (2 shards, every run of the smoke tier passing) and a failing exploration: 1
    planned = plan_jobs(MATRIX, "smoke")
    for k in (1, 2):
        rows = [judge(job, _report(failing=job.expect) if job.role == "defect" else _report(passing=("x.y",)),
                      run_s=1.0, run_dir=None) for job in shard_jobs(planned, Shard(k, 2))]
        out = tmp_path / f"n{k}" / "selftest"
        out.mkdir(parents=True)
        write_outputs(SelftestResult("smoke", rows, shard=shard_record(Shard(k, 2), planned)), out, MATRIX)
        assert result_document(SelftestResult("smoke", rows), MATRIX)["exit_code"] == EXIT_PASS
    passing = [tmp_path / "n1", tmp_path / "n2"]
    assert merge(passing, tmp_path / "m0").exit_code == EXIT_PASS
    _explore_shard(tmp_path / "n1", Shard(1, 2), {"chaos-mix": [(2, 1)]})
    _explore_shard(tmp_path / "n2", Shard(2, 2), {"chaos-mix": [(1, 0)]})
    result = merge(passing, tmp_path / "m1")
    assert result.exit_code == EXIT_FAIL and result.selftest.exit_code == EXIT_PASS
    cli = CliRunner().invoke(main, ["merge", *map(str, passing), "--out", str(tmp_path / "m2")])
    assert cli.exit_code == EXIT_FAIL and "merge verdict: fail (exit 1)" in cli.output
