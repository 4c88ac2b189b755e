"""`ordeal check` and `ordeal report` on stored runs."""

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


def test_report_needs_report_json(tmp_path):
    result = CliRunner().invoke(main, ["report", str(tmp_path)])
    assert result.exit_code == 3 and "report.json is missing" in result.output


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
