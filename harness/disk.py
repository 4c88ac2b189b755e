"""Size-limited data directories for nodes, inside one mount namespace of the run (faults/disk.py disk_full).

    holder = DiskHolder.start({data_dir: size_bytes, ...}, log_path)
    node.disk = holder            # harness/node.py: the node then starts inside the holder's namespace
    holder.view(data_dir)         # where the harness reaches that tmpfs: /proc/<holder>/root/<data_dir>
    holder.stop()

The holder is one long-lived process (``unshare --mount --propagation private`` + ``sleep``) that mounts a
tmpfs of the given size on each directory and then only keeps its mount namespace alive.  Why a holder and
not ``unshare`` per node start: a node restarted (the heal of a kill) in a fresh namespace would find an
empty tmpfs, and Redis' AOF must survive a process_kill.  Nodes join the namespace with ``nsenter --mount``,
which execs in place (the node's PID stays the PID the harness tracks).

Nothing is ever mounted on the host: the mounts exist only in the holder's namespace, which the kernel frees
when its last process ends.  The holder is spawned like every node (harness/node.py spawn: own process
group, PDEATHSIG, tracked by the reaper), so a dying harness takes it, and the nodes in it, along.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness import reaper
from harness.node import spawn

READY_LINE = "ordeal-disk-holder ready"
MIN_SIZE_BYTES = 1 << 20


class DiskHolderError(RuntimeError):
    """The holder could not start or mount its file systems."""


@dataclass(frozen=True)
class FsSpace:
    """statvfs of a file system, in bytes."""

    size: int
    free: int  # available to an unprivileged writer (f_bavail); tmpfs reserves nothing, so = f_bfree

    def to_dict(self) -> dict[str, int]:
        return {"size_bytes": self.size, "free_bytes": self.free}


def space(path: Path | str) -> FsSpace:
    stat = os.statvfs(path)
    return FsSpace(stat.f_blocks * stat.f_frsize, stat.f_bavail * stat.f_frsize)


def holder_script(sizes: Mapping[Path, int]) -> str:
    """The holder's shell: mount a private tmpfs of each size on each directory, say ready, sleep."""
    lines = ["set -e"]
    for directory, size in sorted(sizes.items()):
        quoted = shlex.quote(str(directory))
        lines.append(f"mkdir -p {quoted}")
        lines.append(f"mount -t tmpfs -o size={int(size)},mode=0755 ordeal-disk {quoted}")
    lines.append(f"echo {shlex.quote(READY_LINE)}")
    lines.append("exec sleep infinity")
    return "\n".join(lines)


class DiskHolder:
    """The process that owns the run's mount namespace with the size-limited directories."""

    def __init__(self, process: subprocess.Popen, sizes: Mapping[Path, int], log_path: Path) -> None:
        self.process = process
        self.sizes = {Path(d): int(s) for d, s in sizes.items()}
        self.log_path = log_path

    @classmethod
    def start(cls, sizes: Mapping[Path | str, int], log_path: Path, timeout_s: float = 10.0) -> DiskHolder:
        sizes = {Path(d).resolve(): int(s) for d, s in sizes.items()}
        for directory, size in sizes.items():
            if size < MIN_SIZE_BYTES:
                raise DiskHolderError(f"size-limited directory {directory}: size {size} bytes is below the "
                                      f"minimum {MIN_SIZE_BYTES}")
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            process = spawn(["unshare", "--mount", "--propagation", "private", "sh", "-c", holder_script(sizes)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log)
        holder = cls(process, sizes, log_path)
        line = holder._read_ready(timeout_s)
        if line != READY_LINE:
            holder.stop()
            raise DiskHolderError(f"the disk holder (unshare --mount + tmpfs) did not start: {line!r}; "
                                  f"log {log_path}: {log_path.read_text(errors='replace')[-500:]}")
        return holder

    def _read_ready(self, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        os.set_blocking(self.process.stdout.fileno(), False)
        buffer = b""
        while time.monotonic() < deadline:
            try:
                chunk = self.process.stdout.read()
            except BlockingIOError:
                chunk = None
            if chunk:
                buffer += chunk
                if b"\n" in buffer:
                    return buffer.split(b"\n", 1)[0].decode(errors="replace")
            elif chunk == b"" or self.process.poll() is not None:
                return buffer.decode(errors="replace") or f"exited with {self.process.poll()}"
            time.sleep(0.01)
        return f"no ready line within {timeout_s} s"

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def mount_ns(self) -> str:
        return f"/proc/{self.pid}/ns/mnt"

    def wrap(self, argv: Sequence[str], cwd: Path | str) -> list[str]:
        """argv run inside the holder's mount namespace, from ``cwd`` as that namespace sees it (the cwd
        Popen set is the host's directory, under the tmpfs)."""
        if not self.alive():
            raise DiskHolderError(f"the disk holder (pid {self.pid}) is gone: its mount namespace with "
                                  f"{', '.join(map(str, self.sizes))} went with it")
        return ["nsenter", f"--mount={self.mount_ns()}", "--", "sh", "-c", 'cd "$0" && exec "$@"', str(cwd),
                *map(str, argv)]

    def holds(self, directory: Path | str) -> bool:
        return Path(directory).resolve() in self.sizes

    def view(self, path: Path | str) -> Path:
        """Where the harness reaches ``path`` as the namespace sees it."""
        return Path(f"/proc/{self.pid}/root") / Path(path).resolve().relative_to("/")

    def space(self, directory: Path | str) -> FsSpace:
        return space(self.view(directory))

    def stop(self) -> None:
        """End the holder (its group); the namespace, and its mounts, go when its last node has gone too."""
        if self.process.pid in reaper.tracked():
            reaper.kill_group(self.process.pid, signal.SIGKILL)
        self.process.wait()
        reaper.untrack(self.process.pid)
        if self.process.stdout is not None:
            self.process.stdout.close()

    def describe(self) -> dict:
        return {"pid": self.pid, "mount_namespace": self.mount_ns(),
                "size_limited": {str(d): s for d, s in sorted(self.sizes.items())}}
