"""`ordeal check` and `ordeal report` on stored runs, with Spark: a Spark that cannot start is unknown (exit 2),
runs given as file:// URIs are checked in one batch, and a check's report is written again by `ordeal report`.
The refusals before Spark starts: tests/unit/test_checker_cli.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ordeal.cli import main
from spark_checkers import synthetic as s
from spark_checkers.api import check_runs


@pytest.mark.spark
@pytest.mark.timeout(900)  # Spark on a loaded 2-core machine
def test_spark_that_cannot_start_is_unknown_exit_2(tmp_path):
    """A real Spark failure (an unparsable master URL, raised by the JVM) must end as unknown, exit 2."""
    run = s.write_spec(tmp_path / "run", s.Spec(pairs=1, messages=3))
    ordeal = Path(sys.executable).parent / "ordeal"
    done = subprocess.run([str(ordeal), "check", str(run), "--spark-master", "no-such-master"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stdout + done.stderr
    report = json.loads((run / "report.json").read_text())
    assert report["verdict"] == "unknown"
    assert {i["verdict"] for i in report["invariants"]} == {"unknown"}
    assert "Spark did not start" in report["invariants"][0]["reason"]


@pytest.mark.spark
@pytest.mark.timeout(900)  # Spark on a loaded 2-core machine
def test_runs_given_as_file_uris_are_checked_in_one_batch(spark, tmp_path):
    """Parts handed to Spark as file:// URIs, two runs in one scan: each row still finds its own run."""
    spec = s.Spec(pairs=1, messages=6)
    lossy = s.write_run(tmp_path / "run with space", s.drop_delivery(s.generate(spec), "sub-0", "pub-0", 3), spec)
    clean = s.write_spec(tmp_path / "clean", spec)
    reports = check_runs([lossy.as_uri(), str(clean)], spark=spark)
    assert [r["exit_code"] for r in reports] == [1, 0]
    lost = next(i for i in reports[0]["invariants"] if i["id"] == "durability.lost")
    assert lost["count"] == 1 and lost["witnesses"][0]["data"]["first_seq"] == 3
    result = CliRunner().invoke(main, ["check", lossy.as_uri()])
    assert result.exit_code == 1, result.output
    assert json.loads((lossy / "report.json").read_text())["verdict"] == "fail"


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
