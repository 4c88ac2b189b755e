"""benchmarks/stages.py on a real event log: a classic JVM started with $ORDEAL_SPARK_EVENT_LOG writes a log in
which a labelled check's jobs are found.  The parsing on imitated logs: tests/unit/test_stages.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.stages import check_jobs, jobs_of, read_events, render
from spark_checkers.engine.settings import EVENT_LOG_ENV

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.spark
@pytest.mark.nightly  # for its time (about 25 s): where a check's time goes, the benchmark's tool (benchmarks/stages.py)
def test_a_real_checks_event_log_gives_its_jobs(tmp_path):
    """A classic JVM started with $ORDEAL_SPARK_EVENT_LOG writes a log in which a labelled check's jobs, task
    CPU and operators are found (Spark's own format, which tests/unit/test_stages.py imitates)."""
    ev = tmp_path / "ev"
    script = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
from pathlib import Path
from spark_checkers import synthetic as s
from spark_checkers.api import check_runs
from spark_checkers.engine.spark_session import spark_session
spec = s.Spec(pairs=2, messages=12, scenario_name="event-log")
run = s.write_run(Path({str(tmp_path)!r}) / "run", s.drop_delivery(s.generate(spec), "sub-1", "pub-1", 5), spec)
spark = spark_session("local[1]")
spark.sparkContext.setJobGroup("the-check", "the check")
report = check_runs([run], spark=spark)[0]
assert any(i["id"] == "durability.lost" and i["verdict"] == "fail" for i in report["invariants"]), report
spark.stop()
"""
    env = {k: v for k, v in os.environ.items() if k != "SPARK_CONNECT_MODE_ENABLED"}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env={**env, EVENT_LOG_ENV: str(ev)},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    logs = [p for p in ev.iterdir() if not p.name.startswith(".")]
    assert len(logs) == 1 and logs[0].is_file(), logs  # one plain file per JVM: not compressed, not rolled
    jobs = check_jobs(jobs_of(read_events(logs[0])), "the-check")
    assert len(jobs) >= 3 and sum(j.cpu_s for j in jobs) > 0
    assert any(op == "Scan parquet" for j in jobs for st in j.stages for op, _ in st.operators), render(jobs)
