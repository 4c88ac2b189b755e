"""The history writer: schema, part files, manifest, completeness, threads, crash safety."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from contracts.history_schema import EVENT_SCHEMA, PARQUET_META_KEY, SCHEMA_VERSION, Kind, Phase
from harness.history import HistoryError, HistoryRecorder, read_history, read_manifest


def test_rows_land_in_the_exact_schema(tmp_path: Path):
    recorder = HistoryRecorder(tmp_path, run_id="r1")
    recorder.phase(Phase.RUN_START, seed=1)
    recorder.record(Kind.PUBLISH_INVOKE, client="p", topic="a/b", qos=1, packet_id=3, payload_size=62,
                    publisher="p", pub_seq=1, body_hash="00" * 8, send_wall_us=5)
    recorder.record(Kind.DELIVERY, client="s", dup=False, retain=False, remaining_expiry_s=None)
    recorder.phase(Phase.RUN_END)
    assert recorder.close() is True
    manifest = read_manifest(tmp_path)
    assert manifest["complete"] is True and manifest["schema_version"] == SCHEMA_VERSION and manifest["rows"] == 4
    assert manifest["parts"] == ["events-00000.parquet"] and manifest["part_details"][0]["last_seq"] == 4
    parts = sorted(tmp_path.glob("events-*.parquet"))
    assert parts
    schema = pq.read_schema(parts[0])
    assert schema.equals(EVENT_SCHEMA, check_metadata=False)
    assert schema.metadata[PARQUET_META_KEY] == str(SCHEMA_VERSION).encode()
    table = read_history(tmp_path)
    assert table.column("seq").to_pylist() == [1, 2, 3, 4]
    rows = table.to_pylist()
    assert json.loads(rows[0]["detail"]) == {"phase": "run_start", "seed": 1}
    assert rows[1]["pub_seq"] == 1 and rows[1]["qos"] == 1
    assert all(r["t_mono_us"] >= 0 and r["t_wall_us"] > 1.7e15 for r in rows)


def test_unknown_kinds_and_columns_are_refused(tmp_path: Path):
    recorder = HistoryRecorder(tmp_path, run_id="r")
    with pytest.raises(HistoryError, match="unknown history kind"):
        recorder.record("publish_maybe")
    with pytest.raises(HistoryError, match=r"unknown history column\(s\) \['pubseq'\]"):
        recorder.record(Kind.PUBLISH_ACK, pubseq=1)
    recorder.close()


def test_closed_without_run_end_is_incomplete(tmp_path: Path):
    recorder = HistoryRecorder(tmp_path, run_id="r")
    recorder.phase(Phase.RUN_START)
    assert recorder.close() is False
    manifest = read_manifest(tmp_path)
    assert manifest["complete"] is False and "run_end" in manifest["incomplete_reason"]
    with pytest.raises(HistoryError, match="closed"):
        recorder.record(Kind.PHASE, detail={"phase": "x"})


def test_flushes_by_rows_and_by_time(tmp_path: Path):
    by_rows = HistoryRecorder(tmp_path / "rows", run_id="r", flush_rows=10, flush_interval_s=60)
    for i in range(10):
        by_rows.record(Kind.NODE_EVENT, node=f"n{i}")
    time.sleep(0.5)
    assert read_manifest(tmp_path / "rows")["rows"] == 10  # long before the 60 s interval
    by_rows.close()
    by_time = HistoryRecorder(tmp_path / "time", run_id="r", flush_rows=1000, flush_interval_s=0.2)
    for i in range(3):
        by_time.record(Kind.NODE_EVENT, node=f"n{i}")
    time.sleep(0.7)
    manifest = read_manifest(tmp_path / "time")
    assert manifest["rows"] == 3 and manifest["complete"] is False
    by_time.close()


def test_concurrent_writers_get_unique_increasing_seqs(tmp_path: Path):
    recorder = HistoryRecorder(tmp_path, run_id="r", flush_rows=100, flush_interval_s=0.05)

    def write(name: str) -> None:
        for i in range(500):
            recorder.record(Kind.DELIVERY, client=name, pub_seq=i + 1)

    threads = [threading.Thread(target=write, args=(f"c{k}",)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    recorder.phase(Phase.RUN_END)
    recorder.close()
    table = read_history(tmp_path)
    seqs = table.column("seq").to_pylist()
    assert seqs == list(range(1, 2002))
    for k in range(4):  # each thread's own rows stay in its order
        mine = [r["pub_seq"] for r in table.to_pylist() if r["client"] == f"c{k}"]
        assert mine == list(range(1, 501))


def test_refuses_a_directory_that_already_holds_a_history(tmp_path: Path):
    HistoryRecorder(tmp_path, run_id="r").close()
    with pytest.raises(HistoryError, match="already holds a history"):
        HistoryRecorder(tmp_path, run_id="r2")


def test_a_killed_writer_leaves_a_readable_incomplete_history(tmp_path: Path):
    script = (
        "import sys, time\n"
        "from harness.history import HistoryRecorder\n"
        "from contracts.history_schema import Kind\n"
        "r = HistoryRecorder(sys.argv[1], run_id='k', flush_rows=50, flush_interval_s=0.1)\n"
        "i = 0\n"
        "print('ready', flush=True)\n"
        "while True:\n"
        "    i += 1; r.record(Kind.DELIVERY, client='s', pub_seq=i); time.sleep(0.001)\n"
    )
    process = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE,
                               cwd=Path(__file__).resolve().parents[2])
    try:
        assert process.stdout.readline().strip() == b"ready"
        # Kill it once a part is on disk (a loaded machine may take more than a second to write the first):
        # the point is a SIGKILL between flushes, not how fast the writer is.
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob("events-*.parquet")) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.3)
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    manifest = read_manifest(tmp_path)
    assert manifest["complete"] is False
    table = read_history(tmp_path)
    assert table.num_rows >= manifest["rows"] > 0
    assert table.column("pub_seq").to_pylist() == list(range(1, table.num_rows + 1))
