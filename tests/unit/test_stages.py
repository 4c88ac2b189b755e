"""benchmarks/stages.py: a check's jobs and their task CPU from Spark's event log, and the session setting that
writes the log ($ORDEAL_SPARK_EVENT_LOG)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.stages import check_jobs, jobs_of, main, read_events, render
from spark_checkers.engine.settings import EVENT_LOG_ENV, event_log_conf

ROOT = Path(__file__).resolve().parents[2]


def _job(job_id: int, stages: list[int], t: int, group: str | None = None, site: str = "",
         wall_ms: int = 1500) -> list[dict]:
    properties = {"callSite.short": site, **({"spark.jobGroup.id": group} if group else {})}
    return [{"Event": "SparkListenerJobStart", "Job ID": job_id, "Submission Time": t, "Stage IDs": stages,
             "Properties": properties},
            {"Event": "SparkListenerJobEnd", "Job ID": job_id, "Completion Time": t + wall_ms}]


def _task(stage: int, cpu_ns: int) -> dict:
    return {"Event": "SparkListenerTaskEnd", "Stage ID": stage,
            "Task Metrics": {"Executor CPU Time": cpu_ns, "Executor Deserialize CPU Time": 1_000_000}}


def _stage_done(stage: int, rows: int, *operators: str) -> dict:
    return {"Event": "SparkListenerStageCompleted", "Stage Info": {
        "Stage ID": stage, "RDD Info": [{"Scope": json.dumps({"id": str(i), "name": op})} for i, op in
                                        enumerate(operators)] + [{"Name": "no scope"}],
        "Accumulables": [{"Name": "number of output rows", "Value": str(rows)}]}}


def _log() -> list[dict]:
    """Job 1 before the check; 2-5 the check (3 and 4 from its aside thread, without the group; 4 small and
    short); 6 after it."""
    return [*_job(1, [1], 1000), _task(1, 9_000_000_000),
            *_job(2, [2], 2000, "p2p-first", "collect at jobs.py:167"), _task(2, 2_000_000_000),
            _task(2, 1_500_000_000), _stage_done(2, 4_999_980, "Exchange", "Window", "Exchange"),
            *_job(3, [3, 4], 2100), _task(3, 500_000_000), _task(4, 100_000_000),
            *_job(4, [5], 2200, wall_ms=200), _task(5, 50_000_000),
            *_job(5, [6], 3000, "p2p-first"), _task(6, 250_000_000),
            *_job(6, [7], 9000, "p2p-again"), _task(7, 7_000_000_000)]


def test_a_checks_jobs_are_those_between_its_groups_first_and_last():
    jobs = check_jobs(jobs_of(_log()), "p2p-first")
    assert [j.job_id for j in jobs] == [2, 3, 4, 5]  # the aside thread's jobs too; not 1 (before) nor 6 (after)
    first = jobs[0]
    assert first.wall_s == 1.5 and first.call_site == "collect at jobs.py:167"
    assert first.cpu_s == pytest.approx(3.502)  # executor + deserialisation CPU of both tasks
    stage = first.stages[0]
    assert (stage.tasks, stage.rows_out, stage.operators) == (2, 4_999_980, (("Exchange", 2), ("Window", 1)))
    assert jobs[1].cpu_s == pytest.approx(0.602)  # two stages of one job
    text = render(jobs, min_cpu=0.3)
    assert text.startswith("4 jobs, task CPU 4.4 s")
    assert "stage 2: 3.50 s, 2 tasks, 4,999,980 rows out; Exchange×2, Window" in text
    assert "stage 4" not in text  # under --min-cpu
    assert "\n   5    0.25    1.50" in text  # little CPU, but a second and more of wall time: listed
    assert "\n   4 " not in text  # little CPU and a short wall time: left out


def test_an_unknown_group_names_the_groups_there_are():
    with pytest.raises(ValueError, match=r"no job of group 'p2p-steady1'.*its groups: p2p-again, p2p-first"):
        check_jobs(jobs_of(_log()), "p2p-steady1")


def test_a_log_it_cannot_read_is_named_with_what_to_change(tmp_path, capsys):
    compressed = tmp_path / "events_1_local-1.zstd"
    compressed.write_bytes(b"\x28\xb5\x2f\xfd")
    with pytest.raises(ValueError, match=r"events_1_local-1.zstd: a compressed event log.*compress=false"):
        list(read_events(tmp_path))
    broken = tmp_path / "plain"
    broken.write_text(json.dumps({"Event": "SparkListenerLogStart"}) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"plain, line 2: not a JSON event"):
        list(read_events(broken))
    assert main([str(broken)]) == 3
    assert "plain, line 2" in capsys.readouterr().err


def test_the_event_log_setting(tmp_path, monkeypatch):
    monkeypatch.delenv(EVENT_LOG_ENV, raising=False)
    assert event_log_conf() == {}
    where = tmp_path / "new" / "ev"
    monkeypatch.setenv(EVENT_LOG_ENV, str(where))
    conf = event_log_conf()
    assert where.is_dir()  # made, so the JVM finds it (Spark refuses a missing event log directory)
    assert conf == {"spark.eventLog.enabled": "true", "spark.eventLog.dir": where.as_uri(),
                    "spark.eventLog.compress": "false", "spark.eventLog.rolling.enabled": "false"}
    a_file = tmp_path / "file"
    a_file.write_text("")
    monkeypatch.setenv(EVENT_LOG_ENV, str(a_file / "ev"))
    with pytest.raises(ValueError, match=r"\$ORDEAL_SPARK_EVENT_LOG=.*expected a directory"):
        event_log_conf()


def test_a_bad_event_log_setting_is_a_usage_error_before_anything_starts(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("")
    env = {**os.environ, EVENT_LOG_ENV: str(a_file / "ev"), "ORDEAL_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-m", "ordeal.cli", "spark", "start"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    assert "ORDEAL_SPARK_EVENT_LOG" in done.stderr and "expected a directory" in done.stderr
    assert not (tmp_path / "cache").exists()  # no server was started
