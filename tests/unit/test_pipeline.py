"""ordeal/pipeline.py: the one check-and-write path records every check in summary.json (the self-test's
runs once kept saying "skipped (--no-check)" after they had been checked)."""

from __future__ import annotations

import json

from ordeal.pipeline import check_and_record
from spark_checkers import synthetic as s


def test_a_check_writes_the_reports_and_is_recorded_in_summary_json(tmp_path):
    run = s.write_spec(tmp_path / "run", s.Spec(pairs=1, messages=3), schema_version=9)  # decided without Spark
    # as the self-test's runs were written before this change: no schema_version, check "skipped"
    (run / "summary.json").write_text(json.dumps({"exit_code": 0, "run_exit_code": 0,
                                                  "checked": False, "check": "skipped (--no-check)"}))
    [checked] = check_and_record([run])
    summary = json.loads((run / "summary.json").read_text())
    assert checked.exit_code == summary["exit_code"] == 2 and checked.report["verdict"] == "unknown"
    assert summary["checked"] is True and summary["check"] == {"exit_code": 2} and summary["schema_version"] == 1
    assert (run / "report.json").exists() and (run / "junit.xml").exists() and (run / "report.html").exists()


def test_a_run_without_summary_json_is_checked_and_nothing_is_invented(tmp_path):
    run = s.write_spec(tmp_path / "run", s.Spec(pairs=1, messages=3), schema_version=9)
    [checked] = check_and_record([run])
    assert checked.summary == {} and checked.exit_code == 2 and not (run / "summary.json").exists()
