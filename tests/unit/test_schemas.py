"""report.json, summary.json, scenario.json and the history manifest carry schema_version and match their
JSON Schemas under docs/schemas/; readers refuse a version they do not know, naming the file."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from contracts.scenario import default_scenarios_dir, load_scenario
from contracts.versions import SchemaVersionError, check_version, read_json
from harness.history import HistoryRecorder
from harness.run import build_summary
from ordeal.pipeline import record_check
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
