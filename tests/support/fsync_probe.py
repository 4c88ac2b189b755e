"""A test program with known fsync points, and the checker of what a power loss left of its writes.

``python -m tests.support.fsync_probe write DIR`` does, in DIR:
- ``records.log``: SYNCED records, fsync, then UNSYNCED more records (no fsync);
- ``overwrite.dat``: OLD bytes, fsync, then overwritten in place with NEW bytes (no fsync);
- ``shrink.dat``: FULL bytes, fsync, then truncated to a few bytes (no fsync);
- ``sub/nested.dat`` in a new directory: written, fsynced, the directory fsynced;
- ``state.tmp`` written and fsynced, renamed to ``state.json``, then DIR fsynced (the atomic-replace idiom);
- ``fresh.dat``: created and written, never fsynced.
Before it exits it reads everything back: reads must see the unsynced writes (a page cache).

``check(DIR)`` lists what is wrong with DIR after a power loss (drop of the unsynced writes): synced data
must be there, unsynced data must be gone, the renamed file must be there.  ``check(DIR, expect="all")``
is for a clean shutdown: everything must be there.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

SYNCED, UNSYNCED = 200, 100
OLD, NEW = b"o" * 70_000, b"n" * 70_000  # spans two lazyfs pages
FULL, CUT = bytes(range(256)) * 600, 10
NESTED = b"nested and durable\n"
STATE = json.dumps({"version": 2, "records": SYNCED}).encode()
FRESH = b"never fsynced\n"


def record(index: int) -> bytes:
    return f"record {index:06d} {'x' * 40}\n".encode()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write(directory: Path) -> None:
    with open(directory / "records.log", "ab") as log:
        for index in range(SYNCED):
            log.write(record(index))
        log.flush()
        os.fsync(log.fileno())  # fsync point 1: every record before it is durable
        for index in range(SYNCED, SYNCED + UNSYNCED):
            log.write(record(index))
    with open(directory / "overwrite.dat", "wb") as data:
        data.write(OLD)
        data.flush()
        os.fdatasync(data.fileno())  # fsync point 2
        data.seek(0)
        data.write(NEW)
    with open(directory / "shrink.dat", "wb") as data:
        data.write(FULL)
        data.flush()
        os.fsync(data.fileno())  # fsync point 3
        data.truncate(CUT)
    (directory / "sub").mkdir()
    with open(directory / "sub" / "nested.dat", "wb") as data:
        data.write(NESTED)
        data.flush()
        os.fsync(data.fileno())  # fsync point 4
    _fsync_dir(directory / "sub")
    with open(directory / "state.tmp", "wb") as data:
        data.write(STATE)
        data.flush()
        os.fsync(data.fileno())  # fsync point 5
    os.rename(directory / "state.tmp", directory / "state.json")
    _fsync_dir(directory)  # fsync point 6: the rename is durable
    (directory / "fresh.dat").write_bytes(FRESH)
    problems = check(directory, expect="all")
    if problems:
        raise SystemExit("reads do not see the writes just made: " + "; ".join(problems))


def _expect_equal(problems: list[str], what: str, path: Path, want: bytes) -> None:
    try:
        got = path.read_bytes()
    except OSError as error:
        problems.append(f"{what}: {path.name} unreadable ({error.strerror})")
        return
    if got != want:
        problems.append(f"{what}: {path.name} has {len(got)} bytes {got[:24]!r}..., expected {len(want)} "
                        f"bytes {want[:24]!r}...")


def check(directory: Path, expect: str = "synced") -> list[str]:
    """What is wrong with DIR: ``expect="synced"`` after a power loss, ``"all"`` when nothing was lost."""
    if expect not in ("synced", "all"):
        raise ValueError(f"check: expect = {expect!r}; allowed: 'synced', 'all'")
    everything = expect == "all"
    problems: list[str] = []
    records = [record(index) for index in range(SYNCED + (UNSYNCED if everything else 0))]
    _expect_equal(problems, "synced records" if not everything else "all records",
                  directory / "records.log", b"".join(records))
    _expect_equal(problems, "overwrite", directory / "overwrite.dat", NEW if everything else OLD)
    _expect_equal(problems, "truncate", directory / "shrink.dat", FULL[:CUT] if everything else FULL)
    _expect_equal(problems, "file in a new directory", directory / "sub" / "nested.dat", NESTED)
    _expect_equal(problems, "renamed after fsync of its directory", directory / "state.json", STATE)
    if (directory / "state.tmp").exists():
        problems.append("renamed after fsync of its directory: state.tmp still exists")
    # Metadata is durable at once in this model: fresh.dat exists, but its never-synced data is gone.
    _expect_equal(problems, "never-fsynced file", directory / "fresh.dat", FRESH if everything else b"")
    return problems


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("write", "check", "check-all"):
        print("usage: python -m tests.support.fsync_probe write|check|check-all DIR", file=sys.stderr)
        return 2
    directory = Path(argv[1])
    if argv[0] == "write":
        write(directory)
        return 0
    problems = check(directory, expect="all" if argv[0] == "check-all" else "synced")
    print("\n".join(problems) or "ok")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
