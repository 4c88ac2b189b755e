"""The harness' side of a lazyfs mount: start the serving process, talk to its control socket, end it.

``LazyFsMount`` starts ``python -m harness.lazyfs`` with the harness' no-orphan guarantees
(harness/node.py ``spawn``: own process group, tracked by the reaper), waits until the mount shows in
/proc/self/mountinfo and the control socket answers, and on ``stop`` ends it by PID (SIGTERM: it unmounts
itself; SIGKILL of its group after a grace period) and makes sure nothing is left mounted.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from harness import reaper
from harness.node import spawn


class LazyFsError(RuntimeError):
    """The lazyfs process did not mount, did not answer, or left its mount behind."""


def _unescape(field: str) -> str:
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def mount_points(fstype_prefix: str = "fuse") -> list[str]:
    """The mount points of this mount namespace whose type starts with ``fstype_prefix``."""
    found = []
    with open("/proc/self/mountinfo") as mountinfo:
        for line in mountinfo:
            left, _, right = line.partition(" - ")
            fields = left.split()
            if right.split()[0].startswith(fstype_prefix):
                found.append(_unescape(fields[4]))
    return found


def is_mounted(path: Path | str) -> bool:
    return os.path.realpath(path) in mount_points()


def command(sock_path: Path | str, name: str, timeout: float = 10.0) -> dict:
    """Send one control command (drop-unsynced, sync-all, stats) and return the JSON reply."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(sock_path))
        sock.sendall(name.encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    reply = json.loads(data)
    if not reply.get("ok"):
        raise LazyFsError(f"lazyfs control {sock_path}: {reply.get('error')}")
    return reply


@dataclass
class LazyFsMount:
    """One lazyfs mount: ``backing`` plays the disk, ``mountpoint`` is what the node uses."""

    backing: Path
    mountpoint: Path
    control: Path
    log_path: Path
    ignore_fsync: bool = False
    process: subprocess.Popen | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None and self.process.poll() is None else None

    def start(self, timeout: float = 10.0) -> None:
        if self.pid is not None:
            raise LazyFsError(f"lazyfs at {self.mountpoint}: already running (pid {self.pid})")
        if len(os.fsencode(str(self.control))) > 107:  # sun_path holds 108 bytes with its NUL
            raise LazyFsError(f"lazyfs: control socket path {str(self.control)!r} is longer than the 107 bytes a "
                              "unix socket path may have; choose a shorter 'control' path")
        for path in (self.backing, self.mountpoint, self.control.parent):
            Path(path).mkdir(parents=True, exist_ok=True)
        if is_mounted(self.mountpoint):
            raise LazyFsError(f"lazyfs: {self.mountpoint} is already a mount point")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "harness.lazyfs", str(self.backing), str(self.mountpoint),
                "--control", str(self.control)] + (["--ignore-fsync"] if self.ignore_fsync else [])
        repo = Path(__file__).resolve().parents[2]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")]))}
        with open(self.log_path, "ab") as log:
            self.process = spawn(argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise LazyFsError(f"lazyfs exited with {self.process.returncode} before mounting; log "
                                  f"{self.log_path}:\n{self.log_path.read_text(errors='replace')[-2000:]}")
            if is_mounted(self.mountpoint) and self.control.exists():
                try:
                    self.stats()
                    return
                except OSError:
                    pass
            time.sleep(0.02)
        self.stop()
        raise LazyFsError(f"lazyfs at {self.mountpoint} not ready after {timeout} s; log {self.log_path}")

    def stats(self) -> dict:
        return command(self.control, "stats")

    def drop_unsynced(self) -> dict:
        return command(self.control, "drop-unsynced")

    def sync_all(self) -> dict:
        return command(self.control, "sync-all")

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (it unmounts itself), SIGKILL of its group after ``timeout``; then nothing may be mounted."""
        process = self.process
        if process is not None:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout)
                except subprocess.TimeoutExpired:
                    reaper.kill_group(process.pid, signal.SIGKILL)
                    process.wait()
            reaper.kill_group(process.pid, signal.SIGKILL)  # leftovers of its group, if any
            reaper.untrack(process.pid)
            self.process = None
        if is_mounted(self.mountpoint):  # it died without unmounting (SIGKILL): lazy unmount from here
            subprocess.run(["fusermount3", "-u", "-z", str(self.mountpoint)], check=False,
                           capture_output=True, timeout=10)
        if is_mounted(self.mountpoint):
            raise LazyFsError(f"lazyfs: {self.mountpoint} is still mounted after stop")
