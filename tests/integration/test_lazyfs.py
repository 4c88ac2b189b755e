"""The lazyfs-style FUSE file system against a program with known fsync points (tests/support/fsync_probe.py),
on a real FUSE mount: synced data survives a drop of the unsynced writes, unsynced data is gone, a file
renamed after fsync of its directory survives.  Planted failures show the checks can fail: a mount that
ignores fsync loses synced data; a clean sync keeps the unsynced data."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.lazyfs import LazyFsMount, is_mounted, mount_points
from tests.support import fsync_probe
from tests.support.capabilities import missing_capability

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _fuse_available() -> None:
    if not os.path.exists("/dev/fuse"):
        missing_capability("no /dev/fuse")
    try:
        import pyfuse3  # noqa: F401
    except ImportError:
        missing_capability("pyfuse3 is not installed (pip install 'pyfuse3>=3.3,<4')")
    if subprocess.run(["which", "fusermount3"], capture_output=True).returncode != 0:
        missing_capability("fusermount3 is not installed (apt-get install fuse3)")


def _mount(tmp_path: Path, ignore_fsync: bool = False) -> LazyFsMount:
    mount = LazyFsMount(backing=tmp_path / "disk", mountpoint=tmp_path / "mnt", control=tmp_path / "ctl.sock",
                        log_path=tmp_path / "lazyfs.log", ignore_fsync=ignore_fsync)
    mount.start()
    return mount


def _run_probe(directory: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "tests.support.fsync_probe", "write", str(directory)],
                            cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def _power_loss_then_remount(tmp_path: Path, ignore_fsync: bool = False, sync_instead: bool = False) -> list[str]:
    mount = _mount(tmp_path, ignore_fsync)
    try:
        _run_probe(mount.mountpoint)
        before = mount.stats()
        assert before["unsynced_files"] > 0 and before["unsynced_bytes"] > 0, before
        reply = mount.sync_all() if sync_instead else mount.drop_unsynced()
        if not sync_instead:
            assert reply["bytes_dropped"] == before["unsynced_bytes"], reply
            assert reply["stats"]["unsynced_bytes"] == 0
    finally:
        mount.stop()
    assert not is_mounted(mount.mountpoint)
    remounted = _mount(tmp_path)  # a fresh process over the same disk: nothing of the old one's memory
    try:
        return fsync_probe.check(remounted.mountpoint)
    finally:
        remounted.stop()


def test_synced_survives_unsynced_is_gone_renamed_survives(tmp_path: Path) -> None:
    assert fsync_probe.check(tmp_path / "nothing-here") != []  # the checker is not vacuous
    assert _power_loss_then_remount(tmp_path) == []
    assert fsync_probe.check(tmp_path / "disk") == []  # the backing dir is what the power loss left


def test_planted_mount_that_ignores_fsync_fails_synced_survives(tmp_path: Path) -> None:
    problems = _power_loss_then_remount(tmp_path, ignore_fsync=True)
    assert any(problem.startswith("synced records") for problem in problems), problems
    assert any(problem.startswith("renamed after fsync of its directory") for problem in problems), problems


def test_planted_clean_sync_fails_unsynced_is_gone(tmp_path: Path) -> None:
    problems = _power_loss_then_remount(tmp_path, sync_instead=True)
    assert any(problem.startswith("synced records") for problem in problems), problems  # the extra records
    assert any(problem.startswith("never-fsynced file") for problem in problems), problems
    mount = _mount(tmp_path)
    try:
        assert fsync_probe.check(mount.mountpoint, expect="all") == []
    finally:
        mount.stop()


def test_reads_see_unsynced_writes_and_the_disk_does_not(tmp_path: Path) -> None:
    mount = _mount(tmp_path)
    try:
        path = mount.mountpoint / "f"
        with open(path, "wb") as handle:
            handle.write(b"durable")
            handle.flush()
            os.fsync(handle.fileno())
            handle.write(b" and held")
        assert path.read_bytes() == b"durable and held" and path.stat().st_size == 16
        assert (mount.backing / "f").read_bytes() == b"durable"
        with open(path, "ab") as handle:  # O_APPEND lands after the held bytes, not the disk's
            handle.write(b"!")
        assert path.read_bytes() == b"durable and held!"
        mount.drop_unsynced()
        assert path.read_bytes() == b"durable" and path.stat().st_size == 7  # the kernel's caches dropped too
    finally:
        mount.stop()


def test_nothing_left_mounted_when_killed_or_orphaned(tmp_path: Path) -> None:
    mount = _mount(tmp_path)
    os.killpg(mount.process.pid, signal.SIGKILL)  # no chance to unmount itself
    mount.process.wait()
    # libfuse's auto_unmount helper usually unmounts at once, but not always (seen after an earlier mount in
    # the same pytest process); stop() is the guarantee: it lazily unmounts whatever is left.
    mount.stop()
    assert not is_mounted(mount.mountpoint), mount_points()
    # Its parent dies: PDEATHSIG=SIGTERM makes it unmount and exit.
    parent = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from pathlib import Path; from harness.lazyfs import LazyFsMount\n"
         f"m = LazyFsMount(Path({str(tmp_path / 'disk')!r}), Path({str(tmp_path / 'mnt')!r}), "
         f"Path({str(tmp_path / 'ctl.sock')!r}), Path({str(tmp_path / 'lazyfs.log')!r}))\n"
         "m.start(); print(m.process.pid, flush=True); time.sleep(60)"],
        cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        assert is_mounted(tmp_path / "mnt")
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 5
    while (is_mounted(tmp_path / "mnt") or os.path.exists(f"/proc/{child}")) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not is_mounted(tmp_path / "mnt"), mount_points()
    assert not os.path.exists(f"/proc/{child}") or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]
