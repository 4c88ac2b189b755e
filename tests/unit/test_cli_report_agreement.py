"""What ``ordeal run``, ``ordeal check`` and ``ordeal report`` print agrees with the files the run left, for every
outcome: the verdict and exit code, every failing and unknown invariant with its count, and whether the
history is complete.

The reports are the real code's: ``spark_checkers.api._report`` over the run as ``open_run`` reads it and the
timeline of its small rows, with what the Spark side would have found given by hand (``checked``), and
``check_runs`` itself where no Spark is needed (Spark unavailable: the unit tier's endpoint is unreachable; an
unreadable history).  The broken runs are the real harness's (``run_scenario`` / ``ordeal run``): a target that
never starts, a run interrupted before it finished, a scenario that does not load.  The commands are run in
process (click's CliRunner) and their output is read line by line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from contracts.history_schema import Kind, Phase
from contracts.scenario import find_scenario
from harness.history import read_history
from ordeal.cli import main
from spark_checkers import synthetic as s
from spark_checkers.api import RunOutcome, _report, check_runs
from spark_checkers.loader import open_run
from spark_checkers.reports import summary_lines, write_reports
from spark_checkers.timeline import SMALL_KINDS, build_timeline

SPEC = s.Spec(pairs=1, messages=6)
NAMED = re.compile(r"^  (fail|unknown) ((?:[a-z0-9_]+\.[a-z0-9_]+ ×\d+(?:, )?)+)(?::|$)")
ONE = re.compile(r"([a-z0-9_]+\.[a-z0-9_]+) ×(\d+)")


# -- the reports --------------------------------------------------------------------------------------------

def checked(run_dir: Path, **found) -> dict:
    """The report check_runs makes of this run when the Spark side finds ``found`` (counts, witnesses, errors)."""
    run = open_run(run_dir)
    timeline = None
    if run.readable:
        rows = [r for r in read_history(run_dir / "history").to_pylist() if r["kind"] in SMALL_KINDS]
        timeline = build_timeline(run.run_id, rows, run.guarantees)
    return _report(run, RunOutcome(timeline=timeline, fatal=list(run.fatal), **found), "local[1]", 0.1)


def _with(rows: list[dict], *extra: dict) -> list[dict]:
    return [*rows, *extra]


def _drain_timed_out(rows: list[dict]) -> list[dict]:
    changed = []
    for row in rows:
        if row["kind"] == Kind.PHASE and json.loads(row["detail"]).get("phase") == Phase.DRAIN_END:
            row = {**row, "detail": json.dumps({"phase": Phase.DRAIN_END, "reason": "timeout", "outstanding": 2,
                                                "elapsed_s": 30})}
        changed.append(row)
    return changed


def _node_event(t_us: int, node: str, **detail) -> dict:
    return {"t_mono_us": t_us, "kind": Kind.NODE_EVENT, "node": node, "detail": json.dumps(detail)}


EXITED = _node_event(s.T0_US + 250_000, "broker-1", action="exited", exit_status=-9, planned=False,
                     log_tail=["broker-1 INFO reference_broker: broker-1 ready"])
UNRESPONSIVE = _node_event(s.T0_US + 12_300_000, "broker-1", action="unresponsive", since_us=s.T0_US + 200_000,
                           grace_s=10.0, probe="MQTT CONNECT 127.0.0.2:1883", error="no answer within 2.0 s",
                           log_tail=[])


def _outcome(name: str, tmp: Path) -> tuple[dict, str]:
    """One outcome's report and the verdict it must have."""
    rows = s.generate(SPEC)
    run = lambda rows=rows, spec=SPEC, **kwargs: s.write_run(tmp / "run", rows, spec, **kwargs)  # noqa: E731
    not_bitten = s.Spec(pairs=1, messages=6, faults=(s.Fault("f1", "kill", "redis-7003", 2, 4, bit=None),))
    builders = {
        "pass": lambda: (checked(run()), "pass"),
        "violation": lambda: (checked(run(), counts={"duplicates.qos2": 3, "order.dup_flag": 1}), "fail"),
        "incomplete history": lambda: (checked(run(complete=False, end_reason="the recorder was cut")), "unknown"),
        "drain timeout": lambda: (checked(run(_drain_timed_out(rows))), "unknown"),
        "fault did not bite": lambda: (checked(s.write_spec(tmp / "run", not_bitten)), "unknown"),
        "checker error": lambda: (checked(run(), errors={"order.dup_flag": "Py4JJavaError: the job died"}),
                                  "unknown"),
        # The unit tier's Spark endpoint is unreachable (tests/unit/conftest.py): check_runs's own unknown.
        "spark unavailable": lambda: (check_runs([run()])[0], "unknown"),
        "unreadable history": lambda: (check_runs([run(schema_version=9)])[0], "unknown"),
        "unplanned exit": lambda: (checked(run(_drain_timed_out(_with(rows, EXITED)))), "fail"),
        "unresponsive node": lambda: (checked(run(_with(rows, UNRESPONSIVE))), "fail"),
    }
    return builders[name]()


OUTCOMES = ("pass", "violation", "incomplete history", "drain timeout", "fault did not bite", "checker error",
            "spark unavailable", "unreadable history", "unplanned exit", "unresponsive node")


# -- what agreeing means ------------------------------------------------------------------------------------

def assert_agrees(output: str, report: dict) -> None:
    """The printed lines say what report.json says, each once, and name nothing it does not."""
    lines = output.splitlines()
    assert [line for line in lines if line.startswith("verdict: ")] == [
        f"verdict: {report['verdict']} (exit {report['exit_code']})"], output
    named = [(m[1], found, int(count)) for line in lines if (m := NAMED.match(line))
             for found, count in ONE.findall(m[2])]
    assert sorted(named) == sorted((i["verdict"], i["id"], i["count"]) for i in report["invariants"]
                                   if i["verdict"] in ("fail", "unknown")), output
    (history,) = [line for line in lines if line.startswith("history complete: ")]
    state = history.split()[2]
    meta = next(i for i in report["invariants"] if i["id"] == "meta.history_complete")
    if report["history"]["fatal"]:
        assert state == "unknown" and meta["verdict"] == "unknown", history
    elif report["history"]["incomplete"]:
        assert state == "no" and meta["verdict"] == "unknown", history
        assert report["history"]["incomplete"][0][:60] in history
    else:
        assert state == "yes" and meta["verdict"] == "pass", history


def assert_agrees_unchecked(output: str, summary: dict, exit_code: int) -> None:
    """A run never checked (no report.json): its summary.json's exit code, why, and history."""
    lines = output.splitlines()
    assert exit_code == summary["exit_code"]
    (verdict,) = [line for line in lines if line.startswith("verdict: ")]
    assert verdict.startswith(f"verdict: unknown (exit {summary['exit_code']}): {summary['error']}"), output
    assert not [line for line in lines if NAMED.match(line)], "no invariant was judged"
    (history,) = [line for line in lines if line.startswith("history complete: ")]
    assert summary["history_complete"] is False and history.startswith("history complete: no ("), history
    assert summary["manifest"]["incomplete_reason"] in history


# -- checked runs -------------------------------------------------------------------------------------------

def test_the_outcomes_are_what_they_stand_for(tmp_path):
    """Each report really is the outcome it is named for (else the agreement below proves little)."""
    outcomes = {name: _outcome(name, tmp_path / name) for name in OUTCOMES}
    verdicts = {name: report["verdict"] for name, (report, _) in outcomes.items()}
    assert verdicts == {name: verdict for name, (_, verdict) in outcomes.items()}
    by_id = {name: {i["id"]: i for i in report["invariants"]} for name, (report, _) in outcomes.items()}
    assert by_id["drain timeout"]["meta.history_complete"]["verdict"] == "unknown"
    assert by_id["fault did not bite"]["meta.fault_bit"]["verdict"] == "unknown"
    assert by_id["checker error"]["meta.checker_error"]["verdict"] == "unknown"
    assert "no Spark to check with" in by_id["spark unavailable"]["meta.checker_error"]["reason"]
    assert "node broker-1 had exited" in by_id["unplanned exit"]["meta.history_complete"]["reason"]
    assert by_id["unplanned exit"]["health.unplanned_exit"]["verdict"] == "fail"
    assert by_id["unresponsive node"]["health.unresponsive"]["verdict"] == "fail"


@pytest.mark.parametrize("name", OUTCOMES)
def test_ordeal_report_prints_what_report_json_says(tmp_path, name):
    report, _ = _outcome(name, tmp_path)
    run_dir = tmp_path / "run"
    write_reports(run_dir, report)
    stored = json.loads((run_dir / "report.json").read_text())
    result = CliRunner().invoke(main, ["report", str(run_dir)])
    assert result.exit_code == stored["exit_code"], result.output
    assert_agrees(result.output, stored)
    assert_agrees("\n".join(summary_lines(stored)), stored)  # the one function every command prints


def test_ordeal_check_prints_what_it_wrote_when_spark_is_unavailable(tmp_path):
    run_dir = s.write_spec(tmp_path / "run", SPEC)
    result = CliRunner().invoke(main, ["check", str(run_dir)])
    report = json.loads((run_dir / "report.json").read_text())
    assert result.exit_code == report["exit_code"] == 2, result.output
    assert_agrees(result.output, report)


def test_ordeal_check_prints_what_it_wrote_for_a_history_it_cannot_read(tmp_path):
    run_dir = s.write_spec(tmp_path / "run", SPEC, schema_version=9)
    result = CliRunner().invoke(main, ["check", str(run_dir)])
    report = json.loads((run_dir / "report.json").read_text())
    assert result.exit_code == report["exit_code"] == 2, result.output
    assert_agrees(result.output, report)
    assert "history complete: unknown (" in result.output and "schema_version 9" in result.output


def test_a_drain_timeout_is_never_printed_as_a_complete_history(tmp_path):
    """The old summary printed the manifest's complete flag ("history complete True") beside an unknown
    meta.history_complete (a drain that timed out): now the line is the report's."""
    report, _ = _outcome("drain timeout", tmp_path)
    assert report["history"]["manifest"]["complete"] is True
    (line,) = [x for x in summary_lines(report) if x.startswith("history complete: ")]
    assert line.startswith("history complete: no (the drain timed out"), line


# -- broken runs (no report.json: summary.json is the truth) ------------------------------------------------

def _scenario(tmp: Path, start: str) -> Path:
    text = find_scenario("mosquitto-smoke").read_text()
    text = text.replace('start = ["mosquitto", "-c", "{run_dir}/mosquitto.conf"]', start)
    text = text.replace('data_owner = "mosquitto"', "")
    path = tmp / "broken.toml"
    path.write_text(text)
    return path


def test_ordeal_run_of_a_target_that_never_starts_prints_what_summary_json_says(tmp_path):
    scenario = _scenario(tmp_path, 'start = ["/nonexistent/ordeal-no-broker"]')
    result = CliRunner().invoke(main, ["run", str(scenario), "--no-isolated", "--out", str(tmp_path / "runs")])
    (run_dir,) = (tmp_path / "runs").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert "TargetError" in summary["error"] and "not installed" in summary["error"]
    assert not (run_dir / "report.json").exists()
    assert_agrees_unchecked(result.output, summary, result.exit_code)
    # What `ordeal check` later makes of the same run: its report, printed the same way.
    report = checked(run_dir)
    assert report["verdict"] == "unknown" and "the run broke" in "; ".join(report["history"]["incomplete"])
    assert_agrees("\n".join(summary_lines(report)), report)


def test_ordeal_run_interrupted_before_it_finished_prints_what_summary_json_says(tmp_path, monkeypatch):
    """The interruption (SIGINT / SIGTERM: harness/run.py RunInterrupted) arrives while the target starts."""
    import harness.run

    class Interrupted:
        topology = None
        reset_s = reuse = None

        def prepare(self) -> None:
            pass

        def start(self) -> None:
            raise harness.run.RunInterrupted()

        def stop(self) -> None:
            pass

    monkeypatch.setattr(harness.run, "make_target", lambda *args, **kwargs: Interrupted())
    scenario = _scenario(tmp_path, 'start = ["mosquitto", "-c", "{run_dir}/mosquitto.conf"]')
    result = CliRunner().invoke(main, ["run", str(scenario), "--no-isolated", "--out", str(tmp_path / "runs")])
    (run_dir,) = (tmp_path / "runs").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert "interrupted" in summary["error"] and summary["exit_code"] == 2
    assert_agrees_unchecked(result.output, summary, result.exit_code)
    report = checked(run_dir)
    assert_agrees("\n".join(summary_lines(report)), report)


def test_ordeal_run_of_a_scenario_that_does_not_load_prints_no_verdict(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[scenario]\nname = 'bad'\nduration_s = -1\n")
    result = CliRunner().invoke(main, ["run", str(bad), "--no-isolated", "--out", str(tmp_path / "runs")])
    assert result.exit_code == 3 and "Error: " in result.output, result.output
    assert "verdict: " not in result.output and "history complete" not in result.output
    assert not (tmp_path / "runs").exists()


def test_a_run_level_unknown_beside_a_passing_check_is_said(tmp_path):
    """pipeline.combined_exit_code: a run the harness itself called unknown stays unknown after a clean check;
    the closing line says why the exit code is not the report's."""
    from ordeal.commands.summary import closing_lines

    report, _ = _outcome("pass", tmp_path)
    summary = {"counts": {"fault_errors": 1}, "exit_code": 2}
    (line,) = closing_lines(summary, report, 2)
    assert line.startswith("exit 2, not the check's 0: 1 fault(s) could not be applied or healed")
    assert closing_lines(summary, report, 0) == []
