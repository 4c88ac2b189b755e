"""Disk faults of one node: its data directory full, or one of its persistence files truncated or bit-flipped.

- ``disk_full``: the node's data dir is a size-limited tmpfs inside the run's mount namespace (harness/disk.py;
  the run prepares it before the nodes start when the plan holds a disk_full fault: ReferenceTarget.prepare_disks).
  Apply fills it with one file until ENOSPC (leaving ``headroom_bytes``); heal deletes that file.  Evidence:
  the bytes filled and the free space seen; at heal, the node's own write errors in its log since the fault
  (Redis: "Short write while writing to the AOF file", "Error writing to the AOF file: No space left on
  device", "Background saving error", "Could not save cluster config") and Redis' persistence status, then
  Redis writing again after the space came back.  Only nodes that write their data dir: Redis.  The
  reference broker and Tansu keep nothing there (Tansu's log is in its S3 bucket).
- ``file_truncate`` / ``file_bitflip`` (Jepsen's nemesis.file): SIGKILL the node, cut ``drop_bytes`` off the
  named file (or cut it to ``size_fraction`` of its size) / flip ``flips`` random bits (seeded by the fault
  id) in a byte range of it, start the node again.  Evidence: size before and after / the flipped offsets,
  and whether the node came back (Redis refuses an AOF it cannot parse: its log lines say why).  Heal: a node
  still down is repaired (``repair = "redis-check-aof"``: ``redis-check-aof --fix`` on the AOF manifest,
  which cuts the AOF at the first bad command) and started, or reported down (``repair = "none"``).
"""

from __future__ import annotations

import errno
import math
import os
import random
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import redis

from faults import probes
from faults.base import (
    Check,
    Evidence,
    FaultContext,
    FaultNotApplicable,
    FaultSpec,
    FaultSpecError,
    KindInfo,
    Param,
    register,
)
from faults.redis_cluster_view import wait_until
from faults.selectors import resolve_node

DISK_KINDS = ("disk_full", "file_truncate", "file_bitflip")
FILE_KINDS = ("file_truncate", "file_bitflip")
# Roles whose nodes write their data dir (and so can meet a full disk).  The reference broker writes no files;
# Tansu keeps its log in the S3 bucket (or memory), not its data dir; the S3 stand-in's files are the log.
DISK_WRITING_ROLES = ("redis",)
FILL_NAME = "ordeal-disk-full.fill"
CHUNK_BYTES = 1 << 20
DEFAULT_FS_SIZE_MB = 64
# Redis 7 writes a multi-part AOF (appenddirname, default "appendonlydir"): a base (RDB preamble), incremental
# AOFs and a manifest.  The default file is the incremental AOF the node appends to.
DEFAULT_FILE = "appendonlydir/appendonly.aof.*.incr.aof"
AOF_MANIFEST = "appendonlydir/appendonly.aof.manifest"

# The node's own write errors (Redis 7.0 server.c / aof.c / rdb.c / cluster.c wording).
WRITE_ERROR_PATTERNS = {
    "no_space": r"No space left on device",
    "aof_short_write": r"Short write while writing to the AOF file",
    "aof_write_error": r"Error writing to the AOF file",
    "aof_fsync_error": r"Can't persist AOF for fsync error|fsync error",
    "aof_exit": r"Can't recover from AOF write error",
    "bgsave_error": r"Background saving error|Write error saving DB on disk",
    "cluster_config": r"Could not save cluster config|Fatal: can't update cluster config file",
    "aof_rewrite_error": r"Background AOF rewrite|Error opening /setting AOF rewrite",
}
WRITE_RECOVERED = r"AOF write error looks solved"
# What Redis says when it loads (or refuses) a damaged file (aof.c loadSingleAppendOnlyFile, rdb.c).
LOAD_PATTERNS = {
    "truncated_loaded": r"loaded anyway because aof-load-truncated is enabled",
    "truncated_at": r"Truncating the AOF .* at offset",
    "short_read": r"[Ss]hort read while loading",
    "bad_format": r"Bad file format reading the append only file",
    "unexpected_eof": r"Unexpected end of file reading the append only file|Unrecoverable error reading the append",
    "rdb_checksum": r"Wrong RDB checksum",
    "rdb_error": r"Internal error in RDB reading|Short read or OOM loading DB",
    "fatal": r"Fatal error loading|Can't handle RDB format",
}
MAX_LINES = 8


# -- pure parts ------------------------------------------------------------------------------------------

def check_relative_file(value: str) -> str | None:
    """A persistence file's name: relative to the node's data dir, inside it (a glob is allowed)."""
    path = PurePosixPath(value)
    if not value or path.is_absolute() or ".." in path.parts:
        return "must be a path relative to the node's data directory, inside it (no leading /, no ..)"
    return None


def _natural_key(name: str) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def find_file(data_dir: Path, pattern: str) -> Path | None:
    """The file ``pattern`` names under ``data_dir``: the path itself, or the last glob match in natural order
    (appendonly.aof.10.incr.aof after .9.)."""
    exact = data_dir / pattern
    if exact.is_file():
        return exact
    matches = [p for p in data_dir.glob(pattern) if p.is_file()]
    return max(matches, key=lambda p: _natural_key(str(p.relative_to(data_dir)))) if matches else None


def list_files(data_dir: Path, limit: int = 20) -> list[str]:
    found = sorted(str(p.relative_to(data_dir)) for p in data_dir.rglob("*") if p.is_file())
    return found[:limit]


def truncated_size(size: int, drop_bytes: int, size_fraction: float) -> int:
    """The new size: ``drop_bytes`` fewer, or ``size_fraction`` of it, whichever cuts more (never below 0)."""
    return max(0, min(int(size * size_fraction), size - drop_bytes))


def truncate_file(path: Path, drop_bytes: int, size_fraction: float = 1.0) -> tuple[int, int]:
    """Cut the file; (size before, size after)."""
    before = path.stat().st_size
    after = truncated_size(before, drop_bytes, size_fraction)
    os.truncate(path, after)
    return before, after


def bit_positions(size: int, flips: int, rng: random.Random, range_start: float = 0.0,
                  range_end: float = 1.0) -> list[tuple[int, int]]:
    """``flips`` distinct (byte offset, bit) pairs in bytes [size*range_start, size*range_end), sorted; all of
    them when the range holds fewer bits.  Distinct, so that no flip undoes another."""
    if size <= 0:
        return []
    first = min(int(size * range_start), size - 1)
    last = max(first + 1, min(size, math.ceil(size * range_end)))  # at least one byte
    bits = range(first * 8, last * 8)
    chosen = rng.sample(bits, min(flips, len(bits)))
    return sorted((bit // 8, bit % 8) for bit in chosen)


def flip_bits(path: Path, positions: list[tuple[int, int]]) -> list[dict[str, int]]:
    """Flip each (offset, bit) in place; what each byte was and became."""
    flipped = []
    with open(path, "r+b") as handle:
        for offset, bit in positions:
            handle.seek(offset)
            old = handle.read(1)[0]
            new = old ^ (1 << bit)
            handle.seek(offset)
            handle.write(bytes([new]))
            flipped.append({"offset": offset, "bit": bit, "before": old, "after": new})
        handle.flush()
        os.fsync(handle.fileno())
    return flipped


def fill_until_full(path: Path, headroom_bytes: int, free_bytes: int, chunk: int = CHUNK_BYTES) -> tuple[int, str]:
    """Write ``path`` until the file system is full (ENOSPC) or only ``headroom_bytes`` are left of the
    ``free_bytes`` it had; (bytes written, how it ended: "ENOSPC" | "headroom")."""
    goal = max(0, free_bytes - headroom_bytes)
    written = 0
    block = b"\0" * chunk
    with open(path, "wb", buffering=0) as handle:
        while written < goal or headroom_bytes == 0:
            want = chunk if headroom_bytes == 0 else min(chunk, goal - written)
            try:
                written += handle.write(block[:want])
            except OSError as error:
                if error.errno != errno.ENOSPC:
                    raise
                return written, "ENOSPC"
        os.fsync(handle.fileno())
    return written, "headroom"


def matching_lines(text: str, patterns: dict[str, str], limit: int = MAX_LINES) -> dict[str, Any]:
    """{"counts": {name: n}, "lines": [first few]}: the lines of ``text`` that match any pattern."""
    counts: dict[str, int] = {}
    lines: list[str] = []
    for line in text.splitlines():
        hits = [name for name, pattern in patterns.items() if re.search(pattern, line)]
        for name in hits:
            counts[name] = counts.get(name, 0) + 1
        if hits and len(lines) < limit:
            lines.append(line[:300])
    return {"counts": counts, "lines": lines}


def read_log_from(path: Path, offset: int) -> str:
    try:
        with open(path, "rb") as log:
            log.seek(offset)
            return log.read().decode("utf-8", "replace")
    except OSError:
        return ""


def log_size(path: Path) -> int:
    try:
        return Path(path).stat().st_size
    except OSError:
        return 0


# -- live parts ------------------------------------------------------------------------------------------

def _redis_persistence(node: Any) -> dict[str, Any]:
    """Redis' INFO persistence status fields, or the error reading them."""
    try:
        with redis.Redis(host=node.host, port=node.port, socket_timeout=2.0) as client:
            info = client.info("persistence")
    except (redis.RedisError, OSError) as error:
        return {"error": str(error)}
    return {key: info[key] for key in ("aof_last_write_status", "aof_last_bgrewrite_status",
                                       "rdb_last_bgsave_status", "aof_enabled") if key in info}


@dataclass(frozen=True)
class FillRecord:
    """What the fill did."""

    directory: str
    path: Path
    fs_size: int
    free_before: int
    filled: int
    free_after: int
    ended: str


class _DiskNodeFault:
    def __init__(self, spec: FaultSpec) -> None:
        self.spec = spec
        self.node: Any = None
        self.log_offset = 0

    def _resolve(self, ctx: FaultContext) -> Any:
        if self.node is None:
            self.node = resolve_node(ctx.topology, self.spec.target, ctx.rng_for(self.spec.id),
                                     ctx.broker_key_prefix)
        if not self.node.is_alive():
            raise FaultNotApplicable(f"fault {self.spec.id}: target {self.node.name} is not running")
        if getattr(self.node, "data_dir", None) is None:
            raise FaultNotApplicable(f"fault {self.spec.id} ({self.spec.kind}): {self.node.name} has no data "
                                     "directory the harness can reach")
        return self.node

    def _data_view(self) -> Path:
        return Path(getattr(self.node, "data_view", self.node.data_dir))

    def _log_since(self) -> str:
        return read_log_from(Path(self.node.log_path), self.log_offset)


class DiskFullFault(_DiskNodeFault):
    """Fill the node's size-limited data dir until ENOSPC; heal frees it."""

    def __init__(self, spec: FaultSpec) -> None:
        super().__init__(spec)
        self.fill: FillRecord | None = None

    def apply(self, ctx: FaultContext) -> Evidence:
        node = self._resolve(ctx)
        if node.role not in DISK_WRITING_ROLES:
            raise FaultNotApplicable(
                f"fault {self.spec.id} (disk_full of {node.name}): a {node.role} node writes nothing to its data "
                f"directory (the reference broker keeps no files; Tansu's log is in its bucket), so a full disk "
                f"would not reach it; disk_full applies to: {', '.join(DISK_WRITING_ROLES)}")
        holder = getattr(node, "disk", None)
        if holder is None or not holder.holds(node.data_dir):
            raise FaultNotApplicable(
                f"fault {self.spec.id} (disk_full of {node.name}): its data directory {node.data_dir} is not on a "
                "size-limited file system; the run puts the Redis nodes' data directories on one before they "
                "start when the plan holds a disk_full fault (ReferenceTarget.prepare_disks)")
        self.log_offset = log_size(node.log_path)
        before = holder.space(node.data_dir)
        path = self._data_view() / FILL_NAME
        filled, ended = fill_until_full(path, int(self.spec.params["headroom_bytes"]), before.free)
        after = holder.space(node.data_dir)
        self.fill = FillRecord(str(node.data_dir), path, before.size, before.free, filled, after.free, ended)
        ctx.note_node_event(node.name, "disk_full", fault_id=self.spec.id, filled_bytes=filled,
                            free_bytes=after.free)
        headroom = int(self.spec.params["headroom_bytes"])
        return Evidence.of(Check("data directory full", {
            "node": node.name, "directory": str(node.data_dir), "fs_size_bytes": before.size,
            "free_before_bytes": before.free, "filled_bytes": filled, "free_after_bytes": after.free,
            "headroom_bytes": headroom, "ended": ended}, after.free <= headroom + 4096))

    def heal(self, ctx: FaultContext) -> Evidence:
        node = self.node
        if self.fill is None:  # apply never filled (it was refused): nothing to free
            return Evidence.of(Check("nothing filled", {"node": getattr(node, "name", None)}, False))
        # The node's view of the fault, read before the space comes back.
        persistence = _redis_persistence(node) if node.is_alive() else {"error": "node not running"}
        errors = matching_lines(self._log_since(), WRITE_ERROR_PATTERNS)
        status_err = any(persistence.get(key) == "err" for key in
                         ("aof_last_write_status", "rdb_last_bgsave_status", "aof_last_bgrewrite_status"))
        alive_before = node.is_alive()
        exit_status = None if alive_before else node.exit_status()
        try:
            self.fill.path.unlink()
        except FileNotFoundError:
            pass
        freed = node.disk.space(node.data_dir)
        checks = [
            Check("node met write errors", {"node": node.name, **errors, "persistence": persistence,
                                            "alive": alive_before, "exit_status": exit_status},
                  bool(errors["lines"]) or status_err),
            Check("space freed", {"free_bytes": freed.free, "free_before_fill_bytes": self.fill.free_before},
                  freed.free >= self.fill.free_before - CHUNK_BYTES),
        ]
        if not alive_before:  # Redis exits on a write it cannot recover from (appendfsync always, nodes.conf)
            node.start()
            ctx.note_node_event(node.name, "start", fault_id=self.spec.id, pid=node.pid)
        try:
            node.wait_ready(ctx.ready_timeout_s)
            up = True
        except Exception as error:  # noqa: BLE001 - reported as the check's observation
            up, persistence = False, {"error": str(error)[:500]}
        if up and node.role == "redis":
            ok, observed, waited = wait_until(
                lambda: ((status := _redis_persistence(node)).get("aof_last_write_status", "ok") == "ok"
                         and "error" not in status, status), ctx.effect_timeout_s, interval_s=0.1)
            recovered = matching_lines(read_log_from(Path(node.log_path), self.log_offset), {"recovered": WRITE_RECOVERED})
            checks.append(Check("redis writes again", {**observed, "waited_s": waited,
                                                       "recovered_lines": recovered["lines"][:2],
                                                       "restarted": not alive_before}, ok))
        else:
            checks.append(Check("node up", {"node": node.name, "up": up, **({} if up else persistence)}, up))
        return Evidence.of(*checks)


class _FileFault(_DiskNodeFault):
    """Kill, damage one file of the data dir, start again; heal repairs a node that did not come back."""

    def __init__(self, spec: FaultSpec) -> None:
        super().__init__(spec)
        self.came_back: bool | None = None
        self.file: Path | None = None

    def damage(self, ctx: FaultContext, path: Path) -> Check:
        raise NotImplementedError

    def apply(self, ctx: FaultContext) -> Evidence:
        node = self._resolve(ctx)
        config = getattr(ctx.topology, "config", None)
        why = config.destructive_kill_loses_log(node.role) if hasattr(config, "destructive_kill_loses_log") else ""
        if why:
            raise FaultNotApplicable(f"fault {self.spec.id} ({self.spec.kind} of {node.name}): {why}")
        view = self._data_view()
        pattern = str(self.spec.params["file"])
        path = find_file(view, pattern)
        if path is None:
            raise FaultNotApplicable(f"fault {self.spec.id} ({self.spec.kind} of {node.name}): no file matches "
                                     f"{pattern!r} in its data directory {node.data_dir}; files there: "
                                     f"{', '.join(list_files(view)) or '(none)'}")
        self.file = path
        pid = node.pid
        node.kill()  # SIGKILL: nothing is flushed on the way down (Jepsen: kill, corrupt, restart)
        ctx.note_node_event(node.name, "kill", fault_id=self.spec.id, pid=pid)
        damaged = self.damage(ctx, path)
        self.log_offset = log_size(node.log_path)
        node.start()
        node.expect_exit()  # a refusal to load the damaged file is this fault's doing, not an unplanned exit
        ctx.note_node_event(node.name, "start", fault_id=self.spec.id, pid=node.pid)
        try:
            node.wait_ready(ctx.ready_timeout_s)
            self.came_back = True
            node.down_on_purpose = False  # from here on, an exit is the node's own again
        except Exception:  # noqa: BLE001 - NodeError: it refused; the observation says so
            self.came_back = False
        said = matching_lines(self._log_since(), LOAD_PATTERNS)
        return Evidence.of(
            Check("pid gone", {"node": node.name, "pid": pid, "state": probes.proc_state(pid)}, probes.pid_gone(pid)),
            damaged,
            Check("node restarted on the damaged file", {
                "node": node.name, "came_back": self.came_back,
                "exit_status": None if self.came_back else node.exit_status(), **said}, True),
        )

    def heal(self, ctx: FaultContext) -> Evidence:
        node = self.node
        if node is None or self.came_back is None:
            return Evidence.of(Check("nothing damaged", {"node": getattr(node, "name", None)}, False))
        repaired: dict[str, Any] = {}
        if not node.is_alive():
            if self.spec.params["repair"] == "redis-check-aof" and node.role == "redis":
                repaired = self._check_aof(node)
            else:
                repaired = {"repair": self.spec.params["repair"], "done": False}
            self.log_offset = log_size(node.log_path)
            node.start()
            ctx.note_node_event(node.name, "start", fault_id=self.spec.id, pid=node.pid, repaired=repaired)
        try:
            node.wait_ready(ctx.ready_timeout_s)
            up, error = True, ""
        except Exception as failure:  # noqa: BLE001 - the check's observation
            up, error = False, str(failure)[:600]
        state = probes.port_state(node.host, node.port) if up else None
        return Evidence.of(Check("node up", {"node": node.name, "came_back_at_apply": self.came_back,
                                             "repaired": repaired, "port": state,
                                             **({"error": error} if error else {})},
                                 up and state == "accepts"))

    def _check_aof(self, node: Any) -> dict[str, Any]:
        """``redis-check-aof --fix`` on the AOF manifest (Redis 7's multi-part AOF): it cuts the AOF at the
        first command it cannot parse, after asking (answered "y")."""
        server = Path(node.argv[0])
        name = "valkey-check-aof" if server.name.startswith("valkey") else "redis-check-aof"
        binary = server.with_name(name)
        tool = str(binary) if binary.is_file() else shutil.which(name)
        view = self._data_view()
        manifest = view / AOF_MANIFEST
        target = manifest if manifest.is_file() else self.file
        if tool is None:
            return {"repair": "redis-check-aof", "done": False, "error": f"{name} not found"}
        result = subprocess.run([tool, "--fix", str(target)], input="y\n", capture_output=True, text=True,
                                timeout=60, check=False)
        out = (result.stdout + result.stderr).strip().splitlines()
        return {"repair": "redis-check-aof", "done": result.returncode == 0, "exit_code": result.returncode,
                "file": str(target.relative_to(view)), "output": out[-6:]}


class TruncateFault(_FileFault):
    def damage(self, ctx: FaultContext, path: Path) -> Check:
        before, after = truncate_file(path, int(self.spec.params["drop_bytes"]),
                                      float(self.spec.params["size_fraction"]))
        return Check("file truncated", {"file": str(path.relative_to(self._data_view())), "size_before": before,
                                        "size_after": after}, after < before)


class BitflipFault(_FileFault):
    def damage(self, ctx: FaultContext, path: Path) -> Check:
        size = path.stat().st_size
        positions = bit_positions(size, int(self.spec.params["flips"]), ctx.rng_for(self.spec.id),
                                  float(self.spec.params["range_start"]), float(self.spec.params["range_end"]))
        flipped = flip_bits(path, positions)
        return Check("bits flipped", {"file": str(path.relative_to(self._data_view())), "size": size,
                                      "flipped": flipped}, bool(flipped))


def _bitflip(spec: FaultSpec) -> BitflipFault:
    if float(spec.params["range_start"]) >= float(spec.params["range_end"]):
        raise FaultSpecError(f"fault {spec.id!r}: kind 'file_bitflip': range_start = {spec.params['range_start']!r} "
                             f"must be below range_end = {spec.params['range_end']!r} (fractions of the file size, "
                             "0 <= range_start < range_end <= 1)")
    return BitflipFault(spec)


_FILE = Param("file", str, DEFAULT_FILE, "the file, relative to the node's data directory (a glob: its last match "
              "in natural order); Redis 7 writes appendonlydir/appendonly.aof.N.base.rdb, .N.incr.aof and "
              "appendonly.aof.manifest (dump.rdb only with save points)", check=check_relative_file)
_REPAIR = Param("repair", str, "redis-check-aof", "at heal, a node still down: redis-check-aof --fix on its AOF "
                "then start it, or none (start it as it is)", choices=("redis-check-aof", "none"))

register(KindInfo(
    name="disk_full", category="process", target="node", factory=DiskFullFault,
    description="fill the node's size-limited data directory until ENOSPC (Redis nodes); heal frees it",
    params=(Param("fs_size_mb", int, DEFAULT_FS_SIZE_MB, "the size of the tmpfs each Redis node's data directory "
                  "is on when the plan holds a disk_full fault (the largest of the plan's disk_full faults)",
                  min=4, max=4096),
            Param("headroom_bytes", int, 0, "bytes left free by the fill (0: until ENOSPC)", min=0,
                  max=1 << 40)),
))
register(KindInfo(
    name="file_truncate", category="process", target="node", factory=TruncateFault,
    description="SIGKILL the node, truncate a file of its data directory, start it again (Jepsen nemesis.file)",
    params=(_FILE,
            Param("drop_bytes", int, 16, "bytes cut off the end", min=1, max=1 << 40),
            Param("size_fraction", float, 1.0, "or cut to this fraction of the size (whichever cuts more)",
                  min=0.0, max=1.0),
            _REPAIR),
))
register(KindInfo(
    name="file_bitflip", category="process", target="node", factory=_bitflip,
    description="SIGKILL the node, flip random bits of a file of its data directory, start it again",
    params=(_FILE,
            Param("flips", int, 1, "bits flipped (distinct; seeded by the fault id)", min=1, max=100000),
            Param("range_start", float, 0.0, "where the flipped bytes start, as a fraction of the file size",
                  min=0.0, max=1.0),
            Param("range_end", float, 1.0, "where they end (exclusive), as a fraction of the size", min=0.0,
                  max=1.0),
            _REPAIR),
))


def disk_full_size_bytes(faults: Iterable[Any]) -> int | None:
    """The tmpfs size a plan's disk_full faults ask for (their largest ``fs_size_mb``), None when it has none."""
    sizes = []
    for fault in faults:
        kind = fault.get("kind") if isinstance(fault, Mapping) else getattr(fault, "kind", None)
        if kind != "disk_full":
            continue
        params = (fault.get("params") if isinstance(fault, Mapping) else getattr(fault, "params", None)) or {}
        sizes.append(int(params.get("fs_size_mb", DEFAULT_FS_SIZE_MB)))
    return max(sizes) << 20 if sizes else None
