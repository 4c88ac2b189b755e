"""`ordeal check` and `ordeal report` on stored runs."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from ordeal.cli import main
from spark_checkers import synthetic as s


def test_check_on_a_history_it_cannot_read_exits_2_and_writes_reports(tmp_path):
    run = s.write_spec(tmp_path / "run", s.Spec(pairs=1, messages=3), schema_version=9)
    result = CliRunner().invoke(main, ["check", str(run)])
    assert result.exit_code == 2, result.output
    report = json.loads((run / "report.json").read_text())
    assert report["verdict"] == "unknown" and "schema_version 9" in report["invariants"][0]["reason"]
    assert (run / "junit.xml").exists() and (run / "report.html").exists()


def test_check_rejects_a_missing_directory(tmp_path):
    result = CliRunner().invoke(main, ["check", str(tmp_path / "nope")])
    assert result.exit_code != 0 and "not a directory" in result.output


def test_report_needs_report_json(tmp_path):
    result = CliRunner().invoke(main, ["report", str(tmp_path)])
    assert result.exit_code == 1 and "report.json is missing" in result.output


@pytest.mark.spark
def test_check_then_report_on_a_lost_message(spark, tmp_path):
    spec = s.Spec(pairs=1, messages=6)
    run = s.write_run(tmp_path / "run", s.drop_delivery(s.generate(spec), "sub-0", "pub-0", 3), spec)
    result = CliRunner().invoke(main, ["check", str(run)])
    assert result.exit_code == 1, result.output
    assert "durability.lost" in result.output and "fail" in result.output
    html = (run / "report.html").read_text()
    assert "<svg" in html and "3 never arrived" in html and "<script" not in html
    (run / "report.html").unlink()
    result = CliRunner().invoke(main, ["report", str(run)])
    assert result.exit_code == 1 and (run / "report.html").exists()
