"""`ordeal scoreboard`: stored run reports (small JSON documents written here) summed into the broker x
fault-class table; its counts and words, its outputs and their schema, and its refusals (exit 3, naming the
file).  No Spark, no harness: the unit conftest's ORDEAL_SPARK_REMOTE points nowhere."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from ordeal.cli import main
from ordeal.scoreboard import (
    ScoreboardError,
    broker_name,
    build,
    markdown,
    read_run,
    render_html,
    table_rows,
    text_table,
)

SCHEMA = Path(__file__).resolve().parents[2] / "docs" / "schemas" / "scoreboard.schema.json"

REFERENCE = {"kind": "reference", "promises": {"persistence": "kill"}}
MOSQUITTO = {"kind": "external", "name": "mosquitto", "persistence": "graceful"}


def _invariant(id_: str, verdict: str, count: int = 0, reason: str | None = None) -> dict:
    return {"id": id_, "title": id_, "verdict": verdict, "count": count, "witnesses": [], "reason": reason,
            "allowed": verdict == "allowed", "reported_only": False}


def _fault(kind: str, bit: bool = True) -> dict:
    return {"fault_id": f"f01-{kind}", "kind": kind, "node": None, "t_start_s": 1.0, "t_heal_s": 2.0, "bit": bit,
            "error": None if bit else "could not be applied"}


def _run(root: Path, name: str, *, target: dict, faults=(), found=(), broker_nodes: int = 1,
         defects=(), replay: str | None = "default", summary: dict | None = None,
         report_version: int = 1, scenario_version: int = 1) -> Path:
    """One stored run directory: report.json (a durability.lost pass plus ``found``), scenario.json and,
    when given, summary.json."""
    run_dir = root / name
    run_dir.mkdir(parents=True)
    invariants = [_invariant("durability.lost", "pass"), *found]
    verdicts = {i["verdict"] for i in invariants}
    verdict = "fail" if "fail" in verdicts else "unknown" if "unknown" in verdicts else "pass"
    report = {"schema_version": report_version, "checker_version": "0.1.0", "run_dir": str(run_dir),
              "verdict": verdict, "exit_code": {"pass": 0, "fail": 1, "unknown": 2}[verdict], "summary": {},
              "replay": f"ordeal run scenarios/{name}.toml --seed 1" if replay == "default" else replay,
              "invariants": invariants, "faults": list(faults),
              "history": {"manifest": {"seed": 1}}, "guarantees": {}}
    if any(i["id"] == "durability.lost" and i["verdict"] != "pass" for i in found):
        report["invariants"] = list(found)
    scenario = {"schema_version": scenario_version, "scenario": {"name": name}, "target": target,
                "topology": {"broker_nodes": broker_nodes}, "broker": {"defects": list(defects)}}
    (run_dir / "report.json").write_text(json.dumps(report))
    (run_dir / "scenario.json").write_text(json.dumps(scenario))
    if summary is not None:
        (run_dir / "summary.json").write_text(json.dumps({"schema_version": 1, "seed": 1, **summary}))
    return run_dir


@pytest.fixture
def stored(tmp_path: Path) -> Path:
    """Three brokers (reference, reference on 2 nodes, Mosquitto), three fault classes (none, process_kill,
    net_partition); a pass, violations, an allowed and an unknown run; a run with two fault kinds; a run
    whose only fault did not bite (class none) and is unknown as a run; an explore corpus copy; a run never
    checked."""
    root = tmp_path / "runs"
    _run(root, "ref-smoke", target=REFERENCE)
    _run(root / "cluster", "ref-kill-partition", target=REFERENCE, broker_nodes=2,
         faults=[_fault("process_kill"), _fault("net_partition"), _fault("process_kill")],
         found=[_invariant("durability.lost", "fail", 7), _invariant("order.out_of_order", "fail", 2)])
    _run(root / "cluster", "ref-second-kill", target=REFERENCE, broker_nodes=2, faults=[_fault("process_kill")],
         found=[_invariant("durability.lost", "fail", 12)], replay=None)
    _run(root, "mosquitto-smoke", target=MOSQUITTO)
    _run(root, "mosquitto-kill", target=MOSQUITTO, faults=[_fault("process_kill")],
         found=[_invariant("durability.lost_allowed", "allowed", 37),
                _invariant("durability.session_lost_allowed", "allowed", 3)])
    _run(root, "mosquitto-partition", target=MOSQUITTO, faults=[_fault("net_partition")],
         found=[_invariant("meta.fault_bit", "unknown", 0, "f01-net_partition: no packet was dropped")])
    _run(root, "mosquitto-stop", target=MOSQUITTO, faults=[_fault("process_stop", bit=False)],
         summary={"exit_code": 2, "error": "process_stop of mosquitto could not be applied"})
    copy = root / "corpus" / "mosquitto-kill-1"  # explore corpus entry: a copy of a run stored elsewhere
    copy.mkdir(parents=True)
    (copy / "report.json").write_text((root / "mosquitto-kill" / "report.json").read_text())
    (copy / "entry.json").write_text("{}")
    hung = _run(root, "mosquitto-hung", target=MOSQUITTO, summary={"exit_code": 2, "checked": False})
    (hung / "report.json").unlink()  # never checked: no verdict to count
    return root


def test_the_fixture_gives_exactly_the_expected_table(stored: Path):
    document = build([stored])
    cluster = stored / "cluster"
    assert table_rows(document) == [
        ("mosquitto", "none", "2", "1", "0", "0", "1",
         "undecided: the run itself (1 run), first reason: summary.json exit 2: process_stop of mosquitto could "
         f"not be applied; see {stored / 'mosquitto-stop'}; replay: ordeal run scenarios/mosquitto-stop.toml --seed 1"),
        ("mosquitto", "net_partition", "1", "0", "0", "0", "1",
         "undecided: meta.fault_bit (1 run), first reason: f01-net_partition: no packet was dropped; "
         f"see {stored / 'mosquitto-partition'}; replay: ordeal run scenarios/mosquitto-partition.toml --seed 1"),
        ("mosquitto", "process_kill", "1", "0", "0", "1", "0",
         "allowed: durability.lost_allowed 37 (1 run), durability.session_lost_allowed 3 (1 run); most "
         f"acknowledged messages lost: 37 in {stored / 'mosquitto-kill'}; replay: ordeal run "
         "scenarios/mosquitto-kill.toml --seed 1"),
        ("reference", "none", "1", "1", "0", "0", "0", "nothing found (1 run passed)"),
        ("reference (2 nodes)", "net_partition", "1", "0", "1", "0", "0",
         "violated: durability.lost 7 (1 run), order.out_of_order 2 (1 run); most acknowledged messages lost: 7 "
         f"in {cluster / 'ref-kill-partition'}; replay: ordeal run scenarios/ref-kill-partition.toml --seed 1"),
        ("reference (2 nodes)", "process_kill", "2", "0", "2", "0", "0",
         "violated: durability.lost 19 (2 runs), order.out_of_order 2 (1 run); most acknowledged messages lost: "
         f"12 in {cluster / 'ref-second-kill'}; replay: ordeal replay {cluster / 'ref-second-kill'}"),
    ]
    assert document["outcomes"] == {"pass": 2, "violation": 2, "allowed": 1, "unknown": 2}
    assert document["fault_classes"] == ["none", "net_partition", "process_kill"]
    assert document["skipped_copies"] == [str(stored / "corpus" / "mosquitto-kill-1")]
    assert document["unchecked"] == [str(stored / "mosquitto-hung")]
    assert len(document["runs"]) == 7  # neither the copy nor the unchecked run is counted


def test_the_pointer_is_the_run_with_most_acknowledged_messages_lost_else_the_first(tmp_path: Path):
    _run(tmp_path, "a-dup", target=MOSQUITTO, found=[_invariant("order.dup_flag", "fail", 1)])
    _run(tmp_path, "b-dup", target=MOSQUITTO, found=[_invariant("order.dup_flag", "fail", 5)])
    [cell] = build([tmp_path])["cells"]
    assert cell["pointer"]["run_dir"] == str(tmp_path / "a-dup") and cell["pointer"]["lost"] == 0  # no loss: the first
    assert cell["finding"].startswith(f"violated: order.dup_flag 6 (2 runs); see {tmp_path / 'a-dup'}; replay:")
    _run(tmp_path, "c-lost", target=MOSQUITTO, found=[_invariant("durability.lost", "fail", 2)])
    [cell] = build([tmp_path])["cells"]
    assert cell["pointer"]["run_dir"] == str(tmp_path / "c-lost")  # the one that lost acknowledged messages


def test_a_run_with_two_fault_kinds_counts_once_in_each_and_only_applied_faults_count(stored: Path):
    both = read_run(stored / "cluster" / "ref-kill-partition")
    assert both.fault_classes == ("process_kill", "net_partition")  # the second kill does not count twice
    assert read_run(stored / "mosquitto-stop").fault_classes == ("none",)  # bit false: not applied
    assert read_run(stored / "ref-smoke").fault_classes == ("none",)


def test_the_outcome_of_a_run_violation_then_unknown_then_allowed_then_pass(tmp_path: Path):
    def outcome(name: str, found, summary=None) -> str:
        return read_run(_run(tmp_path, name, target=MOSQUITTO, found=found, summary=summary)).outcome

    allowed = _invariant("durability.lost_allowed", "allowed", 4)
    unknown = _invariant("meta.history_complete", "unknown", 0, "incomplete")
    failed = _invariant("order.dup_flag", "fail", 1)
    assert outcome("fail-unknown", [failed, unknown, allowed]) == "violation"
    assert outcome("unknown-allowed", [unknown, allowed]) == "unknown"  # unknown is never a pass
    assert outcome("allowed", [allowed]) == "allowed"
    assert outcome("reported", [_invariant("liveness.stuck_inflight", "pass", 3)]) == "pass"
    # a clean check does not hide a run-level unknown; a run that passed as a run stays a pass
    assert outcome("run-unknown", [], {"exit_code": 2, "error": "a fault could not apply"}) == "unknown"
    assert outcome("run-pass", [], {"exit_code": 0, "error": None}) == "pass"


def test_the_broker_name_from_the_scenario(tmp_path: Path):
    path = tmp_path / "scenario.json"
    assert broker_name({"target": REFERENCE, "topology": {"broker_nodes": 1}}, path) == "reference"
    assert broker_name({"target": REFERENCE, "topology": {"broker_nodes": 3}}, path) == "reference (3 nodes)"
    assert broker_name({"target": REFERENCE, "topology": {"broker_nodes": 1},
                        "broker": {"defects": ["trim_newest"]}}, path) == "reference (defect trim_newest)"
    assert broker_name({"target": {"kind": "external", "name": "rabbitmq"}}, path) == "rabbitmq"
    assert broker_name({"target": {"kind": "external", "name": "rabbitmq",
                                   "nodes": [{"name": "a"}, {"name": "b"}, {"name": "c"}]}}, path) == "rabbitmq (3 nodes)"
    assert broker_name({"target": {"kind": "external", "name": "rabbitmq", "nodes": [{"name": "a"}]}},
                       path) == "rabbitmq"
    with pytest.raises(ScoreboardError, match=r"scenario.json: target.name: expected the external target's name"):
        broker_name({"target": {"kind": "external"}}, path)


def test_the_cli_prints_the_table_and_exits_0_whatever_the_runs_found(stored: Path):
    result = CliRunner().invoke(main, ["scoreboard", str(stored)])
    assert result.exit_code == 0, result.output  # a report, not a verdict: violations inside, still 0
    lines = result.output.splitlines()
    assert lines[0].split() == ["broker", "fault", "class", "runs", "pass", "violation", "allowed", "unknown",
                                "finding"]
    assert lines[2].split()[:7] == ["mosquitto", "none", "2", "1", "0", "0", "1"]
    assert any(line.startswith("reference (2 nodes)") and "durability.lost 19 (2 runs)" in line for line in lines)
    assert "7 runs: 2 pass, 2 violation, 1 allowed, 2 unknown" in result.output
    assert "1 copies of runs skipped" in result.output
    assert f"1 run never checked, not counted (no report.json: {stored / 'mosquitto-hung'})" in result.output
    assert result.output.startswith(text_table(build([stored])))
    # one run directory alone is a path too
    one = CliRunner().invoke(main, ["scoreboard", str(stored / "mosquitto-kill")])
    assert one.exit_code == 0 and "1 runs: 0 pass, 0 violation, 1 allowed, 0 unknown" in one.output


def test_out_writes_json_markdown_and_html_and_the_json_matches_its_schema(stored: Path, tmp_path: Path):
    out = tmp_path / "board"
    result = CliRunner().invoke(main, ["scoreboard", str(stored), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["scoreboard.html", "scoreboard.json", "scoreboard.md"]
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    document = json.loads((out / "scoreboard.json").read_text())
    jsonschema.validate(document, schema)
    assert document["schema_version"] == 1 and document == build([stored])
    md = (out / "scoreboard.md").read_text()
    assert md.startswith("| broker | fault class | runs | pass | violation | allowed | unknown | finding |\n|---|")
    assert (f"| reference (2 nodes) | process_kill | 2 | 0 | 2 | 0 | 0 | violated: durability.lost 19 (2 runs), "
            f"order.out_of_order 2 (1 run); most acknowledged messages lost: 12 in "
            f"`{stored / 'cluster' / 'ref-second-kill'}`; replay: `ordeal replay {stored / 'cluster' / 'ref-second-kill'}` |"
            ) in md
    assert md == markdown(document)
    html = (out / "scoreboard.html").read_text()
    assert "<td>reference (2 nodes)</td>" in html and str(stored / "mosquitto-kill" / "report.html") in html


def test_the_html_escapes_what_the_stored_reports_say(tmp_path: Path):
    _run(tmp_path, "evil", target={"kind": "external", "name": "<script>alert(1)</script>"},
         found=[_invariant("meta.checker_error", "unknown", 0, "<img src=x onerror=alert(1)>")])
    html = render_html(build([tmp_path]))
    assert "<script>alert" not in html and "<img src" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_a_report_of_an_unknown_schema_version_is_a_usage_error_naming_the_file(stored: Path):
    bad = _run(stored, "future", target=MOSQUITTO, report_version=7)
    result = CliRunner().invoke(main, ["scoreboard", str(stored)])
    assert result.exit_code == 3
    assert f"Error: {bad / 'report.json'}: schema_version 7 is not one this version of Ordeal knows for " \
           "report.json (known: 1)" in result.output
    # its near miss: the same run at version 1 is read
    (bad / "report.json").write_text(json.dumps({**json.loads((bad / "report.json").read_text()),
                                                 "schema_version": 1}))
    assert CliRunner().invoke(main, ["scoreboard", str(stored)]).exit_code == 0


def test_a_scenario_of_an_unknown_schema_version_is_a_usage_error_naming_the_file(tmp_path: Path):
    bad = _run(tmp_path, "future", target=MOSQUITTO, scenario_version=2)
    result = CliRunner().invoke(main, ["scoreboard", str(tmp_path)])
    assert result.exit_code == 3 and f"{bad / 'scenario.json'}: schema_version 2" in result.output


def test_an_unreadable_report_is_a_usage_error_naming_the_file(tmp_path: Path):
    broken = _run(tmp_path, "broken", target=MOSQUITTO)
    (broken / "report.json").write_text("{not json")
    result = CliRunner().invoke(main, ["scoreboard", str(tmp_path)])
    assert result.exit_code == 3 and f"Error: {broken / 'report.json'}: cannot be read as report.json" in result.output
    (broken / "report.json").write_text(json.dumps({"schema_version": 1, "verdict": "pass", "invariants": {}}))
    result = CliRunner().invoke(main, ["scoreboard", str(tmp_path)])
    assert result.exit_code == 3
    assert f"{broken / 'report.json'}: invariants: expected a list of invariant verdicts, got {{}}" in result.output


def test_a_report_without_its_scenario_is_a_usage_error_naming_the_missing_file(tmp_path: Path):
    run = _run(tmp_path, "lonely", target=MOSQUITTO)
    (run / "scenario.json").unlink()
    result = CliRunner().invoke(main, ["scoreboard", str(tmp_path)])
    assert result.exit_code == 3 and f"Error: {run / 'scenario.json'}: missing" in result.output


def test_no_report_under_the_paths_is_a_usage_error(tmp_path: Path):
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    result = CliRunner().invoke(main, ["scoreboard", str(tmp_path / "empty")])
    assert result.exit_code == 3 and f"no run directory (a directory holding report.json and scenario.json) " \
                                      f"under {tmp_path / 'empty'}" in result.output
    # only copies of runs (an explore corpus): still nothing to count, and it says why
    copy = tmp_path / "corpus" / "entry"
    copy.mkdir(parents=True)
    (copy / "report.json").write_text("{}")
    (copy / "entry.json").write_text("{}")
    result = CliRunner().invoke(main, ["scoreboard", str(tmp_path / "corpus")])
    assert result.exit_code == 3 and "1 copies of runs skipped" in result.output
    unchecked = _run(tmp_path / "unchecked", "never", target=MOSQUITTO, summary={"exit_code": 0})
    (unchecked / "report.json").unlink()
    result = CliRunner().invoke(main, ["scoreboard", str(tmp_path / "unchecked")])
    assert result.exit_code == 3 and "1 runs never checked (no report.json; `ordeal check RUN_DIR`" in result.output
    assert CliRunner().invoke(main, ["scoreboard"]).exit_code == 3  # no PATH at all
    assert CliRunner().invoke(main, ["scoreboard", str(tmp_path / "nope")]).exit_code == 3


def test_help_says_the_scoreboard_is_a_report_not_a_verdict():
    result = CliRunner().invoke(main, ["scoreboard", "--help"])
    assert result.exit_code == 0 and "a report, not a verdict" in " ".join(result.output.split())


def test_the_driver_imports_neither_the_harness_nor_the_checkers():
    code = ("import sys, ordeal.scoreboard; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'harness', 'spark_checkers', 'pyspark'}))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            cwd=Path(__file__).resolve().parents[2])
    assert result.stdout.strip() == "[]"
