"""The lazyfs page cache (harness/lazyfs/cache.py) over a real backing file: reads merge held pages over the
disk, flush puts exactly the held state on the disk, truncate-then-grow reads zeros."""

from __future__ import annotations

import os
from pathlib import Path

from harness.lazyfs.cache import PAGE, FileCache


def _cache(tmp_path: Path, content: bytes) -> tuple[Path, FileCache]:
    path = tmp_path / "f"
    path.write_bytes(content)
    return path, FileCache.open_for(os.open(path, os.O_RDWR))


def test_reads_merge_held_pages_over_the_disk_and_the_disk_is_untouched(tmp_path: Path) -> None:
    disk = bytes(range(256)) * (PAGE // 128)  # two pages
    path, cache = _cache(tmp_path, disk)
    cache.write(PAGE - 2, b"ABCD")  # across the page boundary
    cache.write(len(disk) + 10, b"tail")  # past the end: a hole of zeros
    want = disk[:PAGE - 2] + b"ABCD" + disk[PAGE + 2:] + bytes(10) + b"tail"
    assert cache.size == len(want) and cache.read(0, 10 * PAGE) == want
    assert cache.read(PAGE - 3, 6) == disk[PAGE - 3:PAGE - 2] + b"ABCD" + disk[PAGE + 2:PAGE + 3]
    assert path.read_bytes() == disk
    assert cache.unsynced_bytes == 8
    cache.flush()
    assert path.read_bytes() == want


def test_truncate_then_grow_reads_zeros_and_flushes_so(tmp_path: Path) -> None:
    path, cache = _cache(tmp_path, b"x" * 100)
    cache.truncate(10)
    cache.write(50, b"y")
    want = b"x" * 10 + bytes(40) + b"y"
    assert cache.read(0, 1000) == want
    assert path.read_bytes() == b"x" * 100
    cache.flush()
    assert path.read_bytes() == want


def test_truncate_of_a_held_page_zeroes_its_tail(tmp_path: Path) -> None:
    path, cache = _cache(tmp_path, b"")
    cache.write(0, b"z" * 300)
    cache.truncate(5)
    cache.truncate(20)
    assert cache.read(0, 100) == b"z" * 5 + bytes(15)
    cache.flush()
    assert path.read_bytes() == b"z" * 5 + bytes(15)
