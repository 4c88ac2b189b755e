"""The Spark Connect settings that need no JVM: the session choice (spark_checkers/engine/spark_session.py: flag, environment,
endpoint syntax), a malformed --spark-remote or archive setting refused as a usage error before anything starts,
a client outwaiting a stopping server, and the pruning of the server JVM's class archives
(spark_checkers/engine/connect_server.py).  The real server: tests/checkers/test_spark_connect.py."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from contracts.exit_codes import EXIT_USAGE
from spark_checkers.engine import connect_server
from spark_checkers.engine.spark_session import SparkChoice, choose, validate_remote

ORDEAL = [sys.executable, "-m", "ordeal.cli"]
ROOT = Path(__file__).resolve().parents[2]


def _run(args, env=None, **kwargs):
    return subprocess.run([*ORDEAL, *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **(env or {})}, timeout=600, **kwargs)


def test_choice_precedence(monkeypatch):
    monkeypatch.delenv("ORDEAL_SPARK_REMOTE", raising=False)
    monkeypatch.delenv("ORDEAL_SPARK_MASTER", raising=False)
    monkeypatch.setattr("spark_checkers.engine.spark_session._active_classic", lambda: None)
    assert choose() == SparkChoice("local-connect", "")
    assert choose("local[1]") == SparkChoice("classic", "local[1]")
    assert choose("local[1]", "sc://h:1") == SparkChoice("remote", "sc://h:1")
    monkeypatch.setenv("ORDEAL_SPARK_MASTER", "local[3]")
    assert choose() == SparkChoice("classic", "local[3]")
    monkeypatch.setenv("ORDEAL_SPARK_REMOTE", "sc://h:2")
    assert choose() == SparkChoice("remote", "sc://h:2")
    assert choose("local[1]") == SparkChoice("classic", "local[1]")  # a flag beats the environment


@pytest.mark.parametrize("url", ["http://h:1", "sc://", "h:15002", "sc://h:notaport"])
def test_malformed_endpoint_is_refused(url):
    with pytest.raises(ValueError, match="Spark Connect endpoint"):
        validate_remote(url)


def test_malformed_remote_is_a_usage_error(tmp_path):
    done = _run(["check", str(tmp_path), "--spark-remote", "http://127.0.0.1:1"])
    assert done.returncode == 3, done.stderr
    assert "expected sc://HOST:PORT" in done.stderr


def _describe(root: Path, name: str, pyspark: str, **changes) -> Path:
    """An archive and the JSON beside it, as a server leaves them."""
    key = {"pyspark": pyspark, "version": "4.3.0", "jars_mtime_ns": 1, "java": "/usr/bin/java",
           "java_options": "-Xss4m", "memory": "2g", **changes}
    (root / f"{name}.json").write_text(json.dumps(key))
    (root / f"{name}.jsa").write_bytes(b"archive")
    return root / f"{name}.jsa"


def test_archives_no_server_can_map_again_are_pruned_and_the_others_kept(tmp_path):
    ours = tmp_path / "pyspark"
    ours.mkdir()
    key = {"pyspark": str(ours), "version": "4.3.0", "jars_mtime_ns": 1, "java": "/usr/bin/java",
           "java_options": "-Xss4m", "memory": "2g"}
    keep = _describe(tmp_path, "spark-connect-ours", str(ours))
    other_setting = _describe(tmp_path, "spark-connect-b", str(ours), java_options="-Xss8m")  # near miss: kept
    reinstalled = _describe(tmp_path, "spark-connect-c", str(ours), jars_mtime_ns=2)
    upgraded = _describe(tmp_path, "spark-connect-d", str(ours), version="4.2.0")
    gone = _describe(tmp_path, "spark-connect-e", str(tmp_path / "deleted-clone"))
    unreadable = _describe(tmp_path, "spark-connect-f", str(ours))
    unreadable.with_suffix(".json").write_text("{not json")
    stale, fresh = tmp_path / "x.jsa.1.part", tmp_path / "x.jsa.2.part"
    for part in (stale, fresh):
        part.write_bytes(b"half")
    os.utime(stale, (time.time() - connect_server.STALE_PART_S - 60,) * 2)

    connect_server._prune_archives(tmp_path, key, keep)

    left = {p.name for p in tmp_path.iterdir()} - {"pyspark"}
    assert left == {keep.name, keep.with_suffix(".json").name, other_setting.name,
                    other_setting.with_suffix(".json").name, fresh.name}, left
    for removed in (reinstalled, upgraded, gone, unreadable):
        assert not removed.exists() and not removed.with_suffix(".json").exists()


def test_the_archive_settings_are_checked(tmp_path, monkeypatch):
    monkeypatch.setenv("ORDEAL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("ORDEAL_JVM_CACHE_DIR", raising=False)
    monkeypatch.setenv(connect_server.ARCHIVE_ENV, "1")
    assert connect_server.archive_dir() == tmp_path / "cache" / "jvm"  # beside the server's state by default
    monkeypatch.setenv(connect_server.ARCHIVE_ENV, "0")
    assert connect_server.archive_dir() is None
    monkeypatch.setenv(connect_server.ARCHIVE_ENV, "yes")
    with pytest.raises(connect_server.ConnectServerError, match="expected 1 .* or 0"):
        connect_server.archive_dir()
    monkeypatch.setenv(connect_server.ARCHIVE_ENV, "1")
    a_file = tmp_path / "file"
    a_file.write_text("")
    monkeypatch.setenv("ORDEAL_JVM_CACHE_DIR", str(a_file))
    with pytest.raises(connect_server.ConnectServerError, match="is not a directory"):
        connect_server.archive_dir()


@pytest.mark.parametrize("stopping", [{"status": "stopping"}, {"status": "ready", "stop.request": True}])
def test_a_client_never_takes_a_stopping_server(tmp_path, monkeypatch, stopping):
    """The client's side of a stop (the server side: the real-server archive test below).  A server whose state says
    stopping, or that was asked to stop, is outwaited: a background start (``session.prepare``) returns at once and
    starts nothing, and a waiting client waits until its watchdog has ended.  The near miss: a ready server."""
    import fcntl
    import threading

    monkeypatch.setenv("ORDEAL_CACHE_DIR", str(tmp_path))
    p = connect_server.paths()
    spawned: list = []
    monkeypatch.setattr(connect_server, "_spawn_watchdog", lambda *args: spawned.append(args))
    alive = os.open(p.alive, os.O_RDWR | os.O_CREAT)
    fcntl.flock(alive, fcntl.LOCK_EX)  # a watchdog that lives, as far as any client can tell
    try:
        p.state.write_text(json.dumps({"status": "ready"}))
        assert connect_server.ensure_started(wait=False) == {"status": "ready"}
        assert not connect_server._stopping(p, {"status": "ready"})
        state = {k: v for k, v in stopping.items() if k != "stop.request"}
        p.state.write_text(json.dumps(state))
        if stopping.get("stop.request"):
            p.stop_request.write_text("1")
        assert connect_server._stopping(p, state)
        started = time.monotonic()
        assert connect_server.ensure_started(wait=False) == state
        assert time.monotonic() - started < 1 and not spawned
        threading.Timer(0.5, fcntl.flock, [alive, fcntl.LOCK_UN]).start()  # the watchdog ends in half a second
        connect_server._outwait_stopping(p, timeout=10)
        assert time.monotonic() - started >= 0.5
        assert not connect_server.watchdog_alive(p)
    finally:
        connect_server.release_lease()
        os.close(alive)


_WATCHDOG = """
import fcntl, json, os, subprocess, sys, time
root, successor = sys.argv[1], sys.argv[2] == "1"
fd = os.open(os.path.join(root, "alive.lock"), os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)  # blocks while the predecessor holds it
with open(os.path.join(root, "state.json"), "w") as f:
    json.dump({"status": "ready", "watchdog_pid": os.getpid()}, f)
if not successor:
    time.sleep(60)
    sys.exit(0)
while not os.path.exists(os.path.join(root, "stop.request")):
    time.sleep(0.05)
os.unlink(os.path.join(root, "stop.request"))
# a client that arrived while this one stopped: its server takes the lock the moment this one lets it go
nxt = subprocess.Popen([sys.executable, "-c", sys.argv[3], root, "0", sys.argv[3]], start_new_session=True)
with open(os.path.join(root, "next.pid"), "w") as f:
    f.write(str(nxt.pid))
time.sleep(0.5)
os.unlink(os.path.join(root, "state.json"))
"""


def test_stop_waits_for_the_server_it_asked_not_for_its_successor(tmp_path, monkeypatch):
    """`ordeal spark stop` returns once the watchdog it asked has ended, although a server a client started meanwhile
    took alive.lock at once (waiting for that one would wait out its idle timeout).  The near miss: while the asked
    watchdog lives, stop waits.  The watchdogs are processes that keep the lock protocol (the real server: the
    archive test in tests/checkers/test_spark_connect.py)."""
    monkeypatch.setenv("ORDEAL_CACHE_DIR", str(tmp_path))
    p = connect_server.paths()
    old = subprocess.Popen([sys.executable, "-c", _WATCHDOG, str(p.root), "1", _WATCHDOG], start_new_session=True)
    successor = None
    try:
        deadline = time.monotonic() + 20
        while (connect_server.read_state(p) or {}).get("watchdog_pid") != old.pid:
            assert time.monotonic() < deadline and old.poll() is None
            time.sleep(0.05)
        started = time.monotonic()
        assert connect_server.stop(timeout=30) is True
        assert time.monotonic() - started >= 0.5  # it waited for the asked one to end
        successor = int((p.root / "next.pid").read_text())
        assert old.wait(5) == 0
        assert connect_server.watchdog_alive(p)  # the successor holds the lock: not this stop's to wait for
        assert time.monotonic() - started < 20
    finally:
        for pid in (old.pid, successor):
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
        old.wait(5)


def test_a_client_outwaits_a_watchdog_that_holds_the_lock_without_a_state(tmp_path, monkeypatch):
    """A live watchdog without state.json is in its first or last moment: the client waits until it has ended (or
    written its state), so it neither connects to a dying server nor gives up on one being born.  The near miss:
    no watchdog, nothing to wait for."""
    import fcntl
    import threading

    monkeypatch.setenv("ORDEAL_CACHE_DIR", str(tmp_path))
    p = connect_server.paths()
    started = time.monotonic()
    connect_server._outwait_stopping(p, timeout=10)
    assert time.monotonic() - started < 0.5
    alive = os.open(p.alive, os.O_RDWR | os.O_CREAT)
    fcntl.flock(alive, fcntl.LOCK_EX)
    try:
        ends = threading.Timer(0.5, fcntl.flock, [alive, fcntl.LOCK_UN])
        ends.start()
        started = time.monotonic()
        connect_server._outwait_stopping(p, timeout=10)
        assert time.monotonic() - started >= 0.5
    finally:
        ends.join()
        os.close(alive)


@pytest.mark.parametrize("command", [["spark", "start"], ["check", "RUN"]])
@pytest.mark.parametrize("setting", [{connect_server.ARCHIVE_ENV: "yes"}, {"ORDEAL_JVM_CACHE_DIR": "FILE"}])
def test_a_bad_archive_setting_is_a_usage_error_before_anything_starts(tmp_path, command, setting):
    a_file = tmp_path / "file"
    a_file.write_text("")
    env = {k: str(a_file) if v == "FILE" else v for k, v in setting.items()}
    done = _run([str(tmp_path) if a == "RUN" else a for a in command],
                {**env, "ORDEAL_CACHE_DIR": str(tmp_path / "cache")})
    assert done.returncode == EXIT_USAGE, done.stderr
    assert next(iter(setting)) in done.stderr, done.stderr
    assert not (tmp_path / "cache" / "spark-connect").exists()  # no server was started
