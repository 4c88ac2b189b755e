"""report.json, summary.json, scenario.json and the history manifest carry schema_version and match their
JSON Schemas under docs/schemas/; readers refuse a version they do not know, naming the file.  So do
selftest.json and explore-summary.json, of one shard and as ``ordeal merge`` writes them."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from contracts.exit_codes import EXIT_FAIL, EXIT_UNKNOWN
from contracts.scenario import default_scenarios_dir, load_scenario
from contracts.versions import SchemaVersionError, check_version, read_json
from harness.history import HistoryRecorder
from harness.run import build_summary
from ordeal.explore import (
    EXPLORE_SUMMARY_VERSION,
    SUMMARY_NAME,
    ExploredRun,
    ExploreResult,
    ExploreSettings,
    write_summary,
)
from ordeal.merge import merge
from ordeal.pipeline import record_check
from ordeal.selftest import judging
from ordeal.selftest.judging import SelftestResult, discount_shared_failures, judge
from ordeal.selftest.matrix import TIERS, load_matrix
from ordeal.selftest.outputs import SELFTEST_VERSION, result_document
from ordeal.selftest.runner import write_outputs
from ordeal.selftest.tier import plan_jobs
from ordeal.shard import WHOLE, Shard, shard_jobs, shard_record
from properties.generate import make_plan
from spark_checkers import synthetic as s
from spark_checkers.api import check_runs
from spark_checkers.guarantees import Guarantees
from spark_checkers.reports import render_from_report

SCHEMAS = Path(__file__).resolve().parents[2] / "docs" / "schemas"


def schema(name: str) -> dict:
    document = json.loads((SCHEMAS / f"{name}.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(document)
    return document


@pytest.mark.parametrize("path", sorted(default_scenarios_dir().glob("*.toml")), ids=lambda p: p.stem)
def test_every_shipped_scenario_json_matches_its_schema(path):
    document = load_scenario(path).to_dict()
    assert document["schema_version"] == 1
    jsonschema.validate(document, schema("scenario"))


def _history_and_summary(tmp_path: Path) -> Path:
    scenario = load_scenario(default_scenarios_dir() / "p2p-smoke.toml")
    plan = make_plan(scenario, 1)
    run_dir = tmp_path / "run"
    recorder = HistoryRecorder(run_dir / "history", run_id="run", meta={"scenario": scenario.name, "seed": 1})
    recorder.phase("run_start")
    recorder.phase("run_end")
    recorder.close()
    summary = build_summary(run_dir, scenario, plan, "ordeal run p2p-smoke --seed 1", {"total_s": 1.0},
                            {"drain": None, "error": None, "notes": []}, True)
    summary.update(checked=False, check="pending: checked next", exit_code=0, run_exit_code=0)
    (run_dir / "summary.json").write_text(json.dumps(summary))
    return run_dir


def test_manifest_and_summary_match_their_schemas_before_and_after_a_recorded_check(tmp_path):
    run_dir = _history_and_summary(tmp_path)
    jsonschema.validate(json.loads((run_dir / "history" / "manifest.json").read_text()), schema("manifest"))
    jsonschema.validate(read_json(run_dir / "summary.json"), schema("summary"))
    recorded = record_check(run_dir, 1, check_s=0.5)
    assert recorded["checked"] is True and recorded["exit_code"] == 1
    jsonschema.validate(recorded, schema("summary"))


def test_a_report_matches_its_schema(tmp_path):
    """A history the checker refuses (no Spark needed) still yields a full report.json."""
    run = s.write_spec(tmp_path / "run", s.Spec(pairs=1, messages=3), schema_version=9)
    [report] = check_runs([run])
    assert report["schema_version"] == 1 and report["verdict"] == "unknown"
    jsonschema.validate(report, schema("report"))


def test_readers_refuse_an_unknown_version_naming_the_file_and_the_known_ones(tmp_path):
    with pytest.raises(SchemaVersionError, match=r"x/report.json: schema_version 7 .* \(known: 1\)"):
        check_version({"schema_version": 7}, "x/report.json")
    assert check_version({}, "x/summary.json") == {}  # written before the field existed: version 1's layout
    with pytest.raises(ValueError, match=r"scenario.json: schema_version 2 .*known: 1"):
        Guarantees.from_scenario({"schema_version": 2}, "run/scenario.json")
    (tmp_path / "report.json").write_text(json.dumps({"schema_version": 5, "invariants": []}))
    with pytest.raises(SchemaVersionError, match=r"report.json: schema_version 5"):
        render_from_report(tmp_path)
    run_dir = _history_and_summary(tmp_path)
    summary = read_json(run_dir / "summary.json")
    (run_dir / "summary.json").write_text(json.dumps({**summary, "schema_version": 3}))
    with pytest.raises(SchemaVersionError, match=r"summary.json: schema_version 3"):
        record_check(run_dir, 0)


def test_the_scenario_schema_names_the_log_presets_and_formation_orders_the_code_knows():
    from contracts.invariants import LOG_PRESETS
    from contracts.target_nodes import START_ORDERS

    schema = json.loads((SCHEMAS / "scenario.schema.json").read_text())
    assert schema["properties"]["checks"]["properties"]["logs"]["properties"]["preset"]["enum"] == list(LOG_PRESETS)
    formation = schema["properties"]["target"]["properties"]["formation"]["properties"]
    assert formation["start"]["enum"] == list(START_ORDERS)


# ------------------------------------------------------------- selftest.json and explore-summary.json
# Both are written outside a run directory (a self-test's and an exploration's --out) and by ordeal merge.
# The fixtures are built by the writing code itself, without a broker or Spark: the shipped matrix's smoke
# plan judged against report.json-shaped reports (as tests/unit/test_merge.py does), explorations recorded by
# explore's own write_summary.
def _selftest_shard(out: Path, shard, planned) -> dict:
    turn = {job.label: index % 3 for index, job in enumerate(j for j in planned if j.role == "defect")}

    def report(job):
        if job.role == "defect" and turn[job.label] == 0:  # caught, with a witness and its time
            return {"verdict": "fail", "invariants": [
                {"id": i, "verdict": "fail", "witnesses": [{"text": f"witness of {i}", "data": {"t": 1_500_000}}]}
                for i in job.expect]}
        if job.role == "defect" and turn[job.label] == 1:  # undecided
            return {"verdict": "unknown", "invariants": [{"id": i, "verdict": "unknown", "why": "undecided"}
                                                         for i in job.expect]}
        return {"verdict": "pass", "invariants": [{"id": i, "verdict": "pass"}  # a defect: missed
                                                  for i in (*job.expect, "durability.lost")]}

    jobs = shard_jobs(planned, shard)
    rows = [judge(job, report(job), run_s=2.5, run_dir=str(out / "runs" / job.label),
                  replay=f"ordeal replay {job.label}") for job in jobs[:-1]]
    rows.append(judge(jobs[-1], None, run_s=None, run_dir=None, run_error="could not run"))  # nulls where allowed
    result = SelftestResult(tier="smoke", rows=discount_shared_failures(rows), check_s=3.25, total_s=40.0,
                            errors=["the check failed: RuntimeError: x"] if shard.k == 1 else [],
                            shard=shard_record(shard, planned))
    out.mkdir(parents=True)
    write_outputs(result, out, load_matrix())
    return _read_selftest(out)


def _read_selftest(out: Path) -> dict:
    return json.loads((out / "selftest.json").read_text())


def test_selftest_json_of_a_shard_of_the_whole_and_of_ordeal_merge_matches_its_schema(tmp_path):
    selftest = schema("selftest")
    assert selftest["properties"]["schema_version"]["const"] == SELFTEST_VERSION
    planned = plan_jobs(load_matrix(), "smoke")
    whole = _selftest_shard(tmp_path / "whole", WHOLE, planned)
    jsonschema.validate(whole, selftest)
    assert whole["shard"] == {"k": 1, "n": 1, "planned": [job.label for job in planned]}
    shards = [_selftest_shard(tmp_path / f"shard-{k}", Shard(k, 2), planned) for k in (1, 2)]
    for document in shards:
        jsonschema.validate(document, selftest)
    merge([tmp_path / "shard-1", tmp_path / "shard-2"], tmp_path / "merged")
    merged = _read_selftest(tmp_path / "merged" / "selftest")
    assert merged["shard"]["merged"] == [1, 2] and len(merged["rows"]) == len(planned)
    jsonschema.validate(merged, selftest)
    jsonschema.validate(result_document(SelftestResult("smoke"), load_matrix()), selftest)  # no shard record: null

    bad = {**merged, "rows": [{**merged["rows"][0], "seed": str(merged["rows"][0]["seed"])}, *merged["rows"][1:]]}
    with pytest.raises(jsonschema.ValidationError, match="is not of type 'integer'"):
        jsonschema.validate(bad, selftest)
    with pytest.raises(jsonschema.ValidationError):  # a shard record that is neither a shard's nor a merge's
        jsonschema.validate({**whole, "shard": {"k": "1", "n": 1, "planned": []}}, selftest)


def test_the_selftest_schema_names_the_tiers_and_outcomes_the_code_knows():
    selftest = schema("selftest")["properties"]
    assert selftest["tier"]["enum"] == list(TIERS)
    assert set(selftest["rows"]["items"]["properties"]["outcome"]["enum"]) == {
        judging.CAUGHT, judging.MISSED, judging.PASSED, judging.VIOLATION, judging.UNKNOWN, judging.FINDING}
    assert set(selftest["defects"]["items"]["properties"]["outcome"]["enum"]) == {
        judging.CAUGHT, judging.MISSED, judging.UNKNOWN}


def _explore_shard(root: Path, shard, seeds: dict[str, list[tuple[int, int]]]) -> dict:
    """An explore --out (root/explore) and its corpus (root/corpus), every exploration recorded by write_summary."""
    out, corpus = root / "explore", root / "corpus"
    corpus.mkdir(parents=True)
    for scenario, runs in seeds.items():
        explored = []
        for seed, code in runs:
            entry = corpus / f"{scenario}-{seed}" if code == EXIT_FAIL else None
            if entry is not None:
                entry.mkdir()
            explored.append(ExploredRun(seed, code, str(out / f"{scenario}-{seed}-x"), 12.5, 2, 1,
                                        ("order.dup_flag",) if code == EXIT_FAIL else (),
                                        ("meta.history_complete: undecided",) if code == EXIT_UNKNOWN else (),
                                        str(entry) if entry else None))
        result = ExploreResult(scenario, explored, stop_reason="budget: 3 s left", shard=shard, first_seed=runs[0][0])
        write_summary(result, ExploreSettings(300, corpus, out, shard=shard), Path(f"scenarios/{scenario}.toml"))
    return json.loads((out / SUMMARY_NAME).read_text())


def test_explore_summary_of_a_shard_and_of_ordeal_merge_matches_its_schema(tmp_path):
    summary = schema("explore-summary")
    assert summary["properties"]["schema_version"]["const"] == EXPLORE_SUMMARY_VERSION
    one = _explore_shard(tmp_path / "a", Shard(1, 2), {"chaos-mix": [(2, 0), (4, 1)], "session-mix": [(2, 2)]})
    two = _explore_shard(tmp_path / "b", Shard(2, 2), {"chaos-mix": [(1, 0), (3, 0)]})
    for document in (one, two):
        jsonschema.validate(document, summary)
    empty = tmp_path / "nothing"  # an exploration that ran nothing: no first run, no seeds
    write_summary(ExploreResult("chaos-mix", shard=WHOLE), ExploreSettings(1, empty / "corpus", empty),
                  Path("scenarios/chaos-mix.toml"))
    jsonschema.validate(json.loads((empty / SUMMARY_NAME).read_text()), summary)

    merge([tmp_path / "a", tmp_path / "b"], tmp_path / "merged")
    merged = json.loads((tmp_path / "merged" / "explore" / SUMMARY_NAME).read_text())
    assert merged["shard"]["merged"] == [1, 2] and merged["notes"]  # session-mix: shard 2/2 did not explore it
    assert [r["shard"] for r in merged["explorations"][0]["runs"]] == ["2/2", "1/2", "2/2", "1/2"]
    jsonschema.validate(merged, summary)

    exploration = {**one["explorations"][0], "exit_code": "1"}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**one, "explorations": [exploration]}, summary)
    with pytest.raises(jsonschema.ValidationError):  # a shard's summary carries no merged exit code
        jsonschema.validate({**one, "exit_code": 0}, summary)
    run = {**merged["explorations"][0]["runs"][0], "shard": 2}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**merged, "explorations": [{**merged["explorations"][0], "runs": [run]}]}, summary)
