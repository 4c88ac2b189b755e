"""benchmarks/s3_requests.py: Tansu's S3 requests counted by kind from moto's request log."""

from __future__ import annotations

from pathlib import Path

from benchmarks.s3_requests import kind_of, log_size, per_message, requests_since, window

LOG = """\
=== ordeal: start 12:13:23 moto_server -H 127.0.0.1 -p 18755
127.0.0.1 - - [24/Nov/2026 12:13:25] "GET / HTTP/1.1" 200 -
127.0.0.1 - - [24/Nov/2026 12:13:26] "PUT /tansu/clusters/ordeal/topics/in/partitions/0000000000/watermark.json HTTP/1.1" 200 -
127.0.0.1 - - [24/Nov/2026 12:13:26] "PUT /tansu/clusters/ordeal/topics/in/partitions/0000000000/records/00000000000000000000.batch HTTP/1.1" 200 -
127.0.0.1 - - [24/Nov/2026 12:13:27] "GET /tansu?list-type=2&prefix=clusters/ordeal/topics/in/partitions/0000000000/records/ HTTP/1.1" 200 -
127.0.0.1 - - [24/Nov/2026 12:13:27] "GET /tansu/clusters/ordeal/topics/in/partitions/0000000000/records/00000000000000000000.batch HTTP/1.1" 200 -
127.0.0.1 - - [24/Nov/2026 12:13:27] "PUT /tansu/clusters/ordeal/groups/consumers/g/offsets/in/partitions/0000000000.json HTTP/1.1" 200 -
127.0.0.1 - - [24/Nov/2026 12:13:27] "PUT /tansu/clusters/ordeal/groups/consumers/g.json HTTP/1.1" 200 -
"""


def test_requests_are_counted_by_kind_and_from_an_offset(tmp_path: Path):
    log = tmp_path / "s3.log"
    log.write_text(LOG)
    counts = requests_since(log)
    assert counts == {"batch_put": 1, "watermark_put": 1, "batch_get": 1, "list": 1, "offset_put": 1,
                      "group_put": 1, "other": 1, "total": 7}
    start = log_size(log)
    with log.open("a") as handle:
        handle.write(LOG.splitlines()[3] + "\n")
    assert requests_since(log, start) == {**dict.fromkeys(counts, 0), "batch_put": 1, "total": 1}
    assert per_message({"list": 3, "total": 6}, 4) == {"list": 0.75, "total": 1.5}
    assert requests_since(tmp_path / "missing.log")["total"] == 0


def test_kind_of_a_request():
    assert kind_of("GET", "/tansu?list-type=2&prefix=x/") == "list"
    assert kind_of("HEAD", "/tansu/x/records/1.batch") == "other"
    assert kind_of("GET", "/tansu/clusters/ordeal/meta.json") == "other"


def test_a_window_without_s3_requests_reports_none_not_zero(tmp_path: Path):
    log = tmp_path / "s3.log"
    log.write_text(LOG)
    assert window(tmp_path / "missing.log", 0, 100) == {"s3_requests": None,
                                                         "s3_requests_per_published_message": None}
    assert window(log, log_size(log), 100)["s3_requests"] is None       # nothing logged after the offset
    figures = window(log, 0, 7)
    assert figures["s3_requests"]["total"] == 7 and figures["s3_requests_per_published_message"]["total"] == 1.0
