"""Lazyfs data directories for the nodes a plan's power_loss faults can hit (faults/power.py).

    mounts = PowerMounts.start(nodes, run_dir)   # before the nodes start: node.data_dir is now a lazyfs mount
    ...                                          # node.lazyfs is its LazyFsMount; kept across node restarts
    mounts.stop()                                # after the nodes stopped: nothing left mounted

Each node's data directory is the mount point of its own lazyfs process (harness/lazyfs/): file data is held
until the node fsyncs it, so a power loss can drop what it never fsynced.  The backing directory (what "the
disk" holds) lives under ``<run_dir>/lazyfs/<node>/``; the control sockets live in a short directory under
/tmp, because a unix socket path holds at most 107 bytes and run directories are often deeper than that.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contracts.target_nodes import DATA_DIR_PLACEHOLDER, harness_data_dirs  # noqa: F401  (re-exported)
from harness.lazyfs import LazyFsMount

POWER_KINDS = ("power_loss",)
LAZYFS_DIR = "lazyfs"  # under the run dir: each node's backing directory
# The reference topology's roles whose nodes can get a lazyfs data directory: Redis keeps its durable state in
# its data dir, and so does the storage node when it is s3rver (on disk; moto keeps the bucket in memory).  The
# reference broker writes no files; Tansu's log is in its S3 bucket.
POWER_ROLES = ("redis", "storage")


def planned_power_loss(faults: Iterable[Any]) -> bool:
    """Whether a plan's faults (FaultSlot objects or dicts) hold a power_loss."""
    for fault in faults:
        kind = fault.get("kind") if isinstance(fault, Mapping) else getattr(fault, "kind", None)
        if kind in POWER_KINDS:
            return True
    return False


@dataclass
class PowerMounts:
    """The run's lazyfs mounts, one per node, and the /tmp directory of their control sockets."""

    mounts: dict[str, LazyFsMount]
    socket_dir: Path
    settled: dict[str, int] | None = None  # bytes each mount wrote back at ``settle``

    @classmethod
    def start(cls, nodes: Sequence[Any], run_dir: Path, *, ignore_fsync: bool = False) -> PowerMounts:
        """Mount a lazyfs on every node's data dir and set ``node.lazyfs``; all or nothing.  ``ignore_fsync``:
        the planted failure of harness/lazyfs/ (fsync does nothing), for tests that show a power loss biting."""
        socket_dir = Path(tempfile.mkdtemp(prefix="ordeal-lazyfs-", dir="/tmp"))
        started = cls({}, socket_dir)
        try:
            started.extend(nodes, run_dir, ignore_fsync=ignore_fsync)
        except BaseException:
            started.stop()
            raise
        return started

    def extend(self, nodes: Sequence[Any], run_dir: Path, *, ignore_fsync: bool = False) -> None:
        """Mount a lazyfs on more nodes' data dirs (a node started later, e.g. the storage node after Redis);
        what mounted before a failure stays listed, so ``stop`` ends it."""
        for node in nodes:
            mount = LazyFsMount(backing=Path(run_dir) / LAZYFS_DIR / node.name, mountpoint=Path(node.data_dir),
                                control=self.socket_dir / f"{node.name}.sock",
                                log_path=Path(run_dir) / "logs" / f"lazyfs-{node.name}.log",
                                ignore_fsync=ignore_fsync)
            mount.start()
            self.mounts[node.name] = mount
            node.lazyfs = mount

    def settle(self) -> dict[str, int]:
        """Write every held byte back (``sync-all``) and say how many per node.  Called once the topology is
        ready: the set-up's writes (Redis' nodes.conf after CLUSTER REPLICATE, which Redis 7.0 does not fsync)
        count as written back, as a kernel does within its dirty-page expiry (30 s by default); lazyfs has no
        writeback of its own, so without this a power loss would undo the cluster's formation itself."""
        self.settled = {name: int(mount.sync_all().get("bytes_written", 0)) for name, mount in self.mounts.items()}
        return self.settled

    def stop(self) -> None:
        """End every lazyfs process (each unmounts); call after the nodes on them stopped.  Raises if one stays
        mounted, after trying all."""
        errors = []
        for name, mount in self.mounts.items():
            try:
                mount.stop()
            except Exception as error:  # noqa: BLE001 - stop the others, report at the end
                errors.append(f"{name}: {error}")
        self.mounts = {}
        shutil.rmtree(self.socket_dir, ignore_errors=True)
        if errors:
            raise RuntimeError("stopping the lazyfs mounts: " + "; ".join(errors))

    def describe(self) -> dict:
        return {name: {"mountpoint": str(m.mountpoint), "backing": str(m.backing), "control": str(m.control),
                       "pid": m.pid, "settled_bytes": (self.settled or {}).get(name)}
                for name, m in sorted(self.mounts.items())}
