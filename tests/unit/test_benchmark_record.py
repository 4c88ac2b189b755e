"""benchmarks/record.py: a benchmark's --record appends a dated section to the measurements log (a copy here)."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import subprocess
from pathlib import Path

from benchmarks import record, s3_requests

REPO = Path(__file__).resolve().parents[2]
WHEN = dt.datetime(2026, 12, 1, 21, 30, tzinfo=dt.UTC)


def _copy_of_the_log(tmp_path: Path) -> Path:
    log = tmp_path / "measurements.md"
    shutil.copyfile(record.LOG, log)
    return log


def test_append_adds_a_dated_section_with_command_tree_and_table(tmp_path):
    real_before = record.LOG.read_text(encoding="utf-8")
    log = _copy_of_the_log(tmp_path)
    before = log.read_text(encoding="utf-8")
    rows = record.figures({"msg_s_per_core": 690.5, "quiet": {"e2e_ms_p99": 428}, "run_dir": "/tmp/x",
                           "settings": {"note": "a|b"}, "lost": None}, drop=("run_dir",))
    record.append("benchmarks/broker_p2p.py", "python benchmarks/broker_p2p.py --pairs 20", rows, log=log,
                  when=WHEN, tree="abc1234")
    text = log.read_text(encoding="utf-8")
    assert text.startswith(before.rstrip("\n"))  # nothing above is rewritten
    added = text[len(before.rstrip("\n")):]
    assert record.RECORDED_HEADING in text and text.count(record.RECORDED_HEADING) == 1
    assert "### benchmarks/broker_p2p.py, 2026-12-01 21:30 UTC, tree `abc1234`" in added
    assert "`python benchmarks/broker_p2p.py --pairs 20`" in added
    assert "| figure | value |" in added
    assert "| msg_s_per_core | 690.5 |" in added and "| quiet.e2e_ms_p99 | 428 |" in added
    assert "| settings.note | a\\|b |" in added and "| lost | - |" in added
    assert "run_dir" not in added
    record.append("benchmarks/broker_abuse.py", "python benchmarks/broker_abuse.py", [], log=log, when=WHEN,
                  tree="abc1234")
    again = log.read_text(encoding="utf-8")
    assert again.startswith(text.rstrip("\n")) and again.count(record.RECORDED_HEADING) == 1
    assert again.rstrip().endswith("(no figures)")
    assert record.LOG.read_text(encoding="utf-8") == real_before  # the real log is never touched


def test_a_table_takes_every_column_in_first_seen_order():
    text = record.table([{"size": 10000, "steady_s": 3.19}, {"size": 100000, "cold_s": 19.1}])
    assert text.splitlines() == ["| size | steady_s | cold_s |", "|---|---|---|", "| 10000 | 3.19 | - |",
                                 "| 100000 | - | 19.1 |"]


def test_transpose_gives_one_row_per_figure_and_a_column_per_size():
    rows = record.transpose([{"events": 10000, "steady_s": 3.19, "cpu": {"jit": 1}},
                             {"events": 100000, "steady_s": 4.21}], by="events")
    assert rows == [{"figure": "steady_s", "events 10000": 3.19, "events 100000": 4.21},
                    {"figure": "cpu.jit", "events 10000": 1, "events 100000": None}]


def test_command_line_is_relative_to_the_repository():
    shown = record.command_line(REPO / "benchmarks" / "broker_p2p.py", ["--pairs", "20", "--note", "a b"])
    assert shown == "python benchmarks/broker_p2p.py --pairs 20 --note 'a b'"


def test_revision_names_the_tree_or_says_unknown(tmp_path):
    assert record.revision(tmp_path) == "unknown"  # not a git work tree
    if shutil.which("git") and (REPO / ".git").exists():
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        assert record.revision(REPO).split("+")[0] == head


def test_s3_requests_counts_a_stored_log_and_records_it(tmp_path, monkeypatch):
    moto_log = tmp_path / "s3.log"
    moto_log.write_text('"PUT /tansu/clusters/c1/topics/t/partitions/0/records/00000.batch HTTP/1.1" 200 -\n'
                        '"GET /tansu/?list-type=2&prefix=clusters/c1 HTTP/1.1" 200 -\n', encoding="utf-8")
    log = _copy_of_the_log(tmp_path)
    monkeypatch.setattr(record, "LOG", log)
    assert s3_requests.main([str(moto_log), "--messages", "4", "--record"]) == 0
    text = log.read_text(encoding="utf-8")
    assert "### benchmarks/s3_requests.py, " in text
    assert "| s3_requests.batch_put | 1 |" in text and "| s3_requests_per_published_message.list | 0.25 |" in text


def test_stages_records_the_jobs_it_shows(tmp_path, monkeypatch):
    from benchmarks import stages

    events = [{"Event": "SparkListenerJobStart", "Job ID": 1, "Submission Time": 1000, "Stage IDs": [1],
               "Properties": {"callSite.short": "collect at rules.py:1", "spark.jobGroup.id": "p2p-first"}},
              {"Event": "SparkListenerTaskEnd", "Stage ID": 1,
               "Task Metrics": {"Executor CPU Time": 2_000_000_000, "Executor Deserialize CPU Time": 0}},
              {"Event": "SparkListenerJobEnd", "Job ID": 1, "Completion Time": 2500}]
    event_log = tmp_path / "local-1"
    event_log.write_text("".join(json.dumps(e) + "\n" for e in events), encoding="utf-8")
    log = _copy_of_the_log(tmp_path)
    monkeypatch.setattr(record, "LOG", log)
    assert stages.main([str(event_log), "--group", "p2p-first", "--record"]) == 0
    text = log.read_text(encoding="utf-8")
    assert "--group p2p-first --record`" in text
    assert "| all | 2 | - | 1 jobs |" in text and "| 1 | 2 | 1.5 | collect at rules.py:1 |" in text
