"""`ordeal check` and `ordeal report` on stored runs, where they answer before Spark runs: an unreadable history
is unknown (exit 2), a run directory it cannot read is a usage error (3).  With Spark:
tests/checkers/test_check_command.py."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from ordeal.cli import main
from spark_checkers import synthetic as s
from spark_checkers.loader import local_run_dir, spark_uri


def test_check_on_a_history_it_cannot_read_exits_2_and_writes_reports(tmp_path):
    run = s.write_spec(tmp_path / "run", s.Spec(pairs=1, messages=3), schema_version=9)
    result = CliRunner().invoke(main, ["check", str(run)])
    assert result.exit_code == 2, result.output
    report = json.loads((run / "report.json").read_text())
    assert report["verdict"] == "unknown" and "schema_version 9" in report["invariants"][0]["reason"]
    assert (run / "junit.xml").exists() and (run / "report.html").exists()


def test_check_rejects_a_missing_directory(tmp_path):
    result = CliRunner().invoke(main, ["check", str(tmp_path / "nope")])
    assert result.exit_code == 3 and "not a directory" in result.output  # a usage error: not a verdict


@pytest.mark.parametrize("location,needle", [
    ("hdfs://namenode/runs/p2p-1", "hdfs:// are not supported"),
    ("s3a://bucket/runs/p2p-1", "give a local path or a file:// URI"),
    ("file://otherhost/runs/p2p-1", "host 'otherhost'"),
])
def test_check_refuses_run_dirs_it_cannot_read_itself(location, needle):
    result = CliRunner().invoke(main, ["check", location])
    assert result.exit_code == 3 and needle in result.output, result.output


def test_local_run_dir_accepts_paths_and_file_uris(tmp_path):
    odd = tmp_path / "a run dir"
    assert local_run_dir(str(odd)) == odd
    assert local_run_dir(odd.as_uri()) == odd  # percent-encoded space
    assert local_run_dir("file://localhost" + str(odd)) == odd
    assert spark_uri(str(odd / "p.parquet")) == f"file://{odd}/p.parquet"  # Hadoop reads it as is: no %20


def test_report_needs_report_json(tmp_path):
    result = CliRunner().invoke(main, ["report", str(tmp_path)])
    assert result.exit_code == 3 and "report.json is missing" in result.output
