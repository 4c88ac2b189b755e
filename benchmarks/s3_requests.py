"""What Tansu asks of its S3 stand-in, from moto's request log (``<run>/topology/logs/s3.log``).

Every request moto serves is one werkzeug log line (``"PUT /tansu/clusters/... HTTP/1.1" 200 -``).  Tansu 0.6.0's
S3 engine writes per produced batch one ``records/<offset>.batch`` object and the partition's
``watermark.json``; a fetch LISTs a partition's ``records/`` prefix (every batch object ever written there,
nothing is deleted) and GETs the batches from the fetch offset; an offset commit PUTs one object per
partition plus the group's ``<group>.json``.  ``requests_since`` counts them by kind, so a benchmark can
report S3 requests per message for a window of a run.

Run alone, it counts a stored run's log:

    .venv/bin/python benchmarks/s3_requests.py runs/<run>/topology/logs/s3.log [--messages N] [--record]

``--messages`` (the published messages of the window) adds the requests per message; ``--record`` also appends
the figures to docs/measurements.md (benchmarks/record.py).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

_LINE = re.compile(r'"(?P<method>[A-Z]+) (?P<path>\S+) HTTP/[0-9.]+" (?P<status>\d{3})')
KINDS = ("batch_put", "watermark_put", "batch_get", "list", "offset_put", "group_put", "other")


def kind_of(method: str, path: str) -> str:
    if "list-type=2" in path:
        return "list"
    if path.endswith(".batch"):
        return "batch_put" if method == "PUT" else "batch_get" if method == "GET" else "other"
    if path.endswith("/watermark.json") and method == "PUT":
        return "watermark_put"
    if "/groups/consumers/" in path and method == "PUT":
        return "offset_put" if "/offsets/" in path else "group_put"
    return "other"


def log_size(log: Path) -> int:
    """Where the log ends now (a window's start for ``requests_since``)."""
    try:
        return log.stat().st_size
    except OSError:
        return 0


def requests_since(log: Path, offset: int = 0) -> dict[str, int]:
    """Requests by kind (KINDS) logged after byte ``offset``, and their total."""
    counts = dict.fromkeys(KINDS, 0)
    try:
        with log.open("rb") as handle:
            handle.seek(offset)
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return {**counts, "total": 0}
    for match in _LINE.finditer(text):
        counts[kind_of(match["method"], match["path"])] += 1
    return {**counts, "total": sum(counts.values())}


def per_message(counts: dict[str, int], messages: int) -> dict[str, float]:
    """The counts divided by ``messages`` (published messages), rounded."""
    return {kind: round(value / messages, 3) for kind, value in counts.items()} if messages else {}


def window(log: Path, offset: int, messages: int) -> dict[str, dict | None]:
    """A benchmark window's S3 figures, as both benchmarks report them: the requests by kind logged after
    ``offset`` and per published message -- None when nothing was logged (memory storage has no S3 server,
    and "0 requests" would claim a measurement that was not made)."""
    counts = requests_since(log, offset)
    if not counts["total"]:
        return {"s3_requests": None, "s3_requests_per_published_message": None}
    return {"s3_requests": counts, "s3_requests_per_published_message": per_message(counts, messages)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log", type=Path, help="moto's request log, e.g. <run>/topology/logs/s3.log")
    parser.add_argument("--offset", type=int, default=0, help="count only what was logged after this byte")
    parser.add_argument("--messages", type=int, default=0,
                        help="published messages in the window: adds the requests per published message")
    parser.add_argument("--record", action="store_true",
                        help="also append the figures to docs/measurements.md (benchmarks/record.py)")
    args = parser.parse_args(argv)
    if not args.log.is_file():
        parser.error(f"{args.log}: no such file")
    if args.offset < 0 or args.messages < 0:
        parser.error("--offset and --messages must not be negative")
    counts = requests_since(args.log, args.offset)
    result = {"log": str(args.log), "offset": args.offset, "s3_requests": counts,
              "s3_requests_per_published_message": per_message(counts, args.messages) or None}
    print(json.dumps(result, indent=2))
    if args.record:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from benchmarks import record

        record.append("benchmarks/s3_requests.py", record.command_line(__file__, argv), record.figures(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
