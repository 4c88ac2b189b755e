"""Disk faults (faults/disk.py): spec validation names the fault id, the parameter and the allowed values;
truncation and bit flips of a file as pure functions (seeded, reproducible); the fill's stop at the headroom;
Redis' log lines read as write errors and load outcomes; what a run prepares (harness/disk.py)."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

import pytest

from faults.base import FaultContext, FaultNotApplicable, FaultSpecError
from faults.catalog import DEFAULT_TARGETS, PROVIDER_GAPS, build_fault, external_refusal, validate_spec
from faults.disk import (
    DEFAULT_FILE,
    DISK_KINDS,
    LOAD_PATTERNS,
    WRITE_ERROR_PATTERNS,
    bit_positions,
    disk_full_size_bytes,
    fill_until_full,
    find_file,
    flip_bits,
    matching_lines,
    truncate_file,
    truncated_size,
)
from harness.disk import holder_script
from harness.reference_target import ReferenceTarget
from properties.plan import FaultSlot


def spec(kind: str, **params):
    return {"id": "disk-1", "kind": kind, "target": "redis-random-master", "params": params}


def test_defaults_are_filled():
    assert validate_spec(spec("disk_full")).params == {"fs_size_mb": 64, "headroom_bytes": 0}
    assert validate_spec(spec("file_truncate")).params == {"file": DEFAULT_FILE, "drop_bytes": 16,
                                                           "size_fraction": 1.0, "repair": "redis-check-aof"}
    assert validate_spec(spec("file_bitflip")).params == {"file": DEFAULT_FILE, "flips": 1, "range_start": 0.0,
                                                          "range_end": 1.0, "repair": "redis-check-aof"}


@pytest.mark.parametrize("kind, params, says", [
    ("disk_full", {"headroom_bytes": -1}, "'headroom_bytes' = -1: must be >= 0"),
    ("disk_full", {"fs_size_mb": 2}, "'fs_size_mb' = 2: must be >= 4"),
    ("disk_full", {"size": 10}, "unknown parameter(s) size; allowed: fs_size_mb"),
    ("file_truncate", {"drop_bytes": 0}, "'drop_bytes' = 0: must be >= 1"),
    ("file_truncate", {"size_fraction": 1.5}, "'size_fraction' = 1.5: must be <= 1.0"),
    ("file_truncate", {"file": "/etc/passwd"}, "relative to the node's data directory"),
    ("file_truncate", {"file": "appendonlydir/../../x"}, "no .."),
    ("file_bitflip", {"repair": "fsck"}, "expected one of 'redis-check-aof', 'none'"),
    ("file_bitflip", {"flips": 0}, "'flips' = 0: must be >= 1"),
])
def test_bad_params_name_the_fault_the_parameter_and_the_allowed_values(kind, params, says):
    with pytest.raises(FaultSpecError) as error:
        validate_spec(spec(kind, **params))
    assert "'disk-1'" in str(error.value) and says in str(error.value)


def test_bitflip_range_must_be_ordered():
    with pytest.raises(FaultSpecError, match=r"'disk-1'.*range_start = 0.7 must be below range_end = 0.2"):
        build_fault(validate_spec(spec("file_bitflip", range_start=0.7, range_end=0.2)))


def test_truncated_size_cuts_whichever_is_more():
    assert truncated_size(1000, 16, 1.0) == 984
    assert truncated_size(1000, 16, 0.5) == 500
    assert truncated_size(10, 16, 1.0) == 0
    assert truncated_size(1000, 1, 0.0) == 0


def test_truncate_file(tmp_path):
    path = tmp_path / "appendonly.aof"
    path.write_bytes(bytes(range(256)) * 4)
    assert truncate_file(path, 24) == (1024, 1000)
    assert path.read_bytes() == (bytes(range(256)) * 4)[:1000]
    assert truncate_file(path, 1, 0.25) == (1000, 250)
    assert path.stat().st_size == 250


def test_bit_positions_are_seeded_distinct_and_in_range():
    first = bit_positions(10_000, 50, random.Random("7:flip"), 0.25, 0.5)
    assert first == bit_positions(10_000, 50, random.Random("7:flip"), 0.25, 0.5)  # reproducible
    assert first != bit_positions(10_000, 50, random.Random("8:flip"), 0.25, 0.5)
    assert len(set(first)) == 50 and first == sorted(first)
    assert all(2500 <= offset < 5000 and 0 <= bit < 8 for offset, bit in first)
    # fewer bits in the range than asked: every one of them
    assert len(bit_positions(1, 100, random.Random(0))) == 8
    assert bit_positions(0, 3, random.Random(0)) == []
    # a range at the very end still holds a byte
    assert bit_positions(100, 1, random.Random(0), 1.0, 1.0)[0][0] == 99


def test_flip_bits_flips_exactly_those_bits_and_flipping_again_restores(tmp_path):
    path = tmp_path / "dump.rdb"
    original = bytes(range(64))
    path.write_bytes(original)
    positions = bit_positions(64, 5, FaultContext(topology=None, seed=3).rng_for("flip-1"))
    flipped = flip_bits(path, positions)
    damaged = path.read_bytes()
    assert [f["offset"] for f in flipped] == [offset for offset, _ in positions]
    changed_bits = sum(bin(a ^ b).count("1") for a, b in zip(original, damaged, strict=True))
    assert changed_bits == 5
    flip_bits(path, positions)
    assert path.read_bytes() == original


def test_fill_stops_at_the_headroom(tmp_path):
    path = tmp_path / "fill"
    written, ended = fill_until_full(path, headroom_bytes=1 << 20, free_bytes=3 << 20 | 5, chunk=1 << 19)
    assert (written, ended) == ((2 << 20) | 5, "headroom")
    assert path.stat().st_size == written


def test_find_file_takes_the_last_match_in_natural_order(tmp_path):
    aof = tmp_path / "appendonlydir"
    aof.mkdir()
    for name in ("appendonly.aof.9.incr.aof", "appendonly.aof.10.incr.aof", "appendonly.aof.2.base.rdb"):
        (aof / name).write_bytes(b"x")
    assert find_file(tmp_path, DEFAULT_FILE).name == "appendonly.aof.10.incr.aof"
    assert find_file(tmp_path, "appendonlydir/appendonly.aof.2.base.rdb").name == "appendonly.aof.2.base.rdb"
    assert find_file(tmp_path, "dump.rdb") is None


# Lines Redis 7.0.15 wrote here (tests/integration/test_faults_disk.py).
REDIS_LOG = """\
20764:M 02 Dec 2026 14:19:49.626 * Ready to accept connections
20764:M 02 Dec 2026 14:19:51.929 # Short write while writing to the AOF file: (nwritten=3371, expected=5030)
20764:M 02 Dec 2026 14:19:52.100 # Error writing to the AOF file: No space left on device
20764:M 02 Dec 2026 14:19:54.462 # AOF write error looks solved, Redis can write again.
1647:M 02 Dec 2026 14:23:25.093 # !!! Warning: short read while loading the AOF file appendonly.aof.1.incr.aof!!!
1647:M 02 Dec 2026 14:23:25.093 # !!! Truncating the AOF appendonly.aof.1.incr.aof at offset 8271 !!!
1647:M 02 Dec 2026 14:23:25.093 # AOF appendonly.aof.1.incr.aof loaded anyway because aof-load-truncated is enabled
1709:M 02 Dec 2026 14:23:28.681 # Bad file format reading the append only file appendonly.aof.1.incr.aof: make a \
backup of your AOF file, then use ./redis-check-aof --fix <filename.manifest>
"""


def test_redis_log_lines_are_read_as_write_errors_and_load_outcomes():
    errors = matching_lines(REDIS_LOG, WRITE_ERROR_PATTERNS)
    assert errors["counts"] == {"aof_short_write": 1, "aof_write_error": 1, "no_space": 1}
    assert len(errors["lines"]) == 2
    loads = matching_lines(REDIS_LOG, LOAD_PATTERNS)
    assert loads["counts"] == {"short_read": 1, "truncated_at": 1, "truncated_loaded": 1, "bad_format": 1}
    assert matching_lines("all fine\n", WRITE_ERROR_PATTERNS) == {"counts": {}, "lines": []}


def test_disk_full_refuses_a_node_that_writes_no_files():
    fault = build_fault(validate_spec({"id": "full-b", "kind": "disk_full", "target": "broker:1"}))
    fault.node = SimpleNamespace(name="broker-1", role="broker", data_dir=Path("/x"), is_alive=lambda: True)
    with pytest.raises(FaultNotApplicable, match=r"full-b.*broker node writes nothing.*applies to: redis"):
        fault.apply(FaultContext(topology=SimpleNamespace()))


def test_plan_decides_the_size_limited_data_dirs():
    faults = [FaultSlot(fault_id="a", kind="disk_full", target="redis-random-master", start_s=1, end_s=2,
                        params={"fs_size_mb": 32}),
              {"id": "b", "kind": "disk_full", "params": {"fs_size_mb": 128}},
              {"id": "c", "kind": "process_kill"}]
    assert disk_full_size_bytes(faults) == 128 << 20
    assert disk_full_size_bytes(faults[2:]) is None
    target = SimpleNamespace(keeper=None, topology=SimpleNamespace(disk_limits={}),
                             config=SimpleNamespace(provider="local"))
    notes = ReferenceTarget.prepare_disks(target, SimpleNamespace(faults=faults))
    assert target.topology.disk_limits == {"redis": 128 << 20} and "128 MiB" in notes[0]
    # A kept topology's Redis started on the host's file system: the seed gets a fresh topology instead.
    fresh = SimpleNamespace(disk_limits={})
    kept = SimpleNamespace(keeper=object(), reuse=None, topology=None, config=SimpleNamespace(provider="local"),
                           run_dir=Path("/r"), _write_broker_config=None,
                           topology_class=lambda config, run_dir, broker_config: fresh)
    assert ReferenceTarget.prepare_disks(kept, SimpleNamespace(faults=faults[2:])) == []
    assert kept.keeper is not None
    notes = ReferenceTarget.prepare_disks(kept, SimpleNamespace(faults=faults))
    assert kept.keeper is None and kept.topology is fresh and fresh.disk_limits == {"redis": 128 << 20}
    assert "fresh topology" in notes[0]
    containers = SimpleNamespace(keeper=None, topology=SimpleNamespace(), config=SimpleNamespace(provider="containers"))
    with pytest.raises(RuntimeError, match="containers provider's topology has none"):
        ReferenceTarget.prepare_disks(containers, SimpleNamespace(faults=faults))


def test_holder_script_quotes_and_mounts_each_directory():
    script = holder_script({Path("/runs/a b/data/redis-1"): 8 << 20})
    assert "mount -t tmpfs -o size=8388608,mode=0755 ordeal-disk '/runs/a b/data/redis-1'" in script
    assert script.splitlines()[-1] == "exec sleep infinity"


def test_catalog_entries():
    for kind in DISK_KINDS:
        assert DEFAULT_TARGETS[kind] == ("redis-master-of:{subscriber}", "redis-random-replica")
        assert kind in PROVIDER_GAPS["containers"] and kind not in PROVIDER_GAPS["local"]
        assert "black-box target" in external_refusal(kind, ("node:n1",), [{}], (("n1", "broker"),))
