"""The overhead of the lazyfs-style FUSE file system (harness/lazyfs/): the same workload on a plain directory
and through a lazyfs mount over a directory of the same disk, side by side in one run, as a ratio.

Workloads:
- ``append+fsync``: RECORDS records of RECORD_BYTES appended to one file, fsync after each;
- ``append (no fsync)``: the same without fsync (held in lazyfs' memory, the page cache path);
- ``redis SET (appendfsync always)``: SETS SETs via redis-py to a redis-server whose ``dir`` is the directory.

    .venv/bin/python benchmarks/lazyfs.py [--records N] [--sets N] [--record]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import record  # noqa: E402
from harness.lazyfs import LazyFsMount  # noqa: E402
from harness.node import spawn  # noqa: E402


def append_workload(directory: Path, records: int, record_bytes: int, fsync: bool) -> float:
    line = b"r" * (record_bytes - 1) + b"\n"
    path = directory / f"bench-{'sync' if fsync else 'nosync'}.log"
    started = time.perf_counter()
    with open(path, "ab", buffering=0) as log:
        for _ in range(records):
            log.write(line)
            if fsync:
                os.fsync(log.fileno())
    elapsed = time.perf_counter() - started
    path.unlink()
    return elapsed


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def redis_workload(directory: Path, sets: int) -> float:
    import redis

    port = _free_port()
    server = spawn(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory),
                    "--appendonly", "yes", "--appendfsync", "always", "--save", ""],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = redis.Redis(port=port, socket_timeout=10)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        started = time.perf_counter()
        for index in range(sets):
            client.set(f"key:{index}", "v" * 100)
        return time.perf_counter() - started
    finally:
        server.terminate()
        server.wait(10)


def run(records: int, record_bytes: int, sets: int) -> list[dict[str, object]]:
    base = Path(tempfile.mkdtemp(prefix="lazyfs-bench-"))
    plain = base / "plain"
    plain.mkdir()
    mount = LazyFsMount(backing=base / "disk", mountpoint=base / "mnt", control=base / "ctl.sock",
                        log_path=base / "lazyfs.log")
    mount.start()
    rows: list[dict[str, object]] = []
    try:
        workloads = [
            ("append+fsync", records, lambda d: append_workload(d, records, record_bytes, True)),
            ("append (no fsync)", records, lambda d: append_workload(d, records, record_bytes, False)),
        ]
        if shutil.which("redis-server") and sets:
            workloads.append(("redis SET (appendfsync always)", sets, lambda d: redis_workload(d, sets)))
        for name, operations, workload in workloads:
            plain_s = workload(plain)
            lazy_s = workload(mount.mountpoint)
            rows.append({"workload": name, "operations": operations,
                         "plain ops/s": round(operations / plain_s), "lazyfs ops/s": round(operations / lazy_s),
                         "lazyfs/plain time": round(lazy_s / plain_s, 2)})
    finally:
        mount.stop()
        shutil.rmtree(base, ignore_errors=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=2000, help="records per append workload")
    parser.add_argument("--record-bytes", type=int, default=200, help="bytes per record")
    parser.add_argument("--sets", type=int, default=2000, help="Redis SETs (0: skip the Redis workload)")
    parser.add_argument("--record", action="store_true",
                        help="also append the figures to docs/measurements.md (benchmarks/record.py)")
    args = parser.parse_args(argv)
    for name in ("records", "record_bytes"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.sets < 0:
        parser.error("--sets must be >= 0")
    rows = run(args.records, args.record_bytes, args.sets)
    print(f"{'workload':34} {'ops':>6} {'plain ops/s':>12} {'lazyfs ops/s':>13} {'lazyfs/plain time':>18}")
    for row in rows:
        print(f"{row['workload']:34} {row['operations']:>6} {row['plain ops/s']:>12} {row['lazyfs ops/s']:>13} "
              f"{row['lazyfs/plain time']:>18}")
    if args.record:
        record.append("benchmarks/lazyfs.py", record.command_line(__file__, argv), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
