"""The node handle: one server process of the topology, with full control over its life.

``ProcessNode`` runs any argv as a node (Redis, Tansu, the S3 server, reference-broker nodes,
mosquitto...).  Every child is started
- in its own process group (signals reach the whole group, teardown never hits anyone else), and
- with ``prctl(PR_SET_PDEATHSIG, SIGKILL)``, so the kernel kills it when the harness dies, even by SIGKILL.

PDEATHSIG fires when the *thread* that forked the child exits, not the process.  So every child is forked
by one long-lived daemon thread (``_Spawner``); a node restarted from a short-lived worker thread would
otherwise be killed the moment that worker ends."""

from __future__ import annotations

import concurrent.futures
import ctypes
import os
import queue
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from harness import reaper

PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)
_prctl = _libc.prctl  # looked up before any fork: nothing but a plain call happens in the child
_prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
_prctl.restype = ctypes.c_int


class NodeError(RuntimeError):
    """A node failed to start, died, or did not become ready."""


def _die_with_parent(parent_pid: int) -> Callable[[], None]:
    def preexec() -> None:  # runs in the child between fork and exec; stderr is already the node's log
        if _prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            os.write(2, b"ordeal: prctl(PR_SET_PDEATHSIG) failed; refusing to start an orphanable process\n")
            os._exit(127)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


class _Spawner:
    """A daemon thread that lives as long as the process and does every fork (see module docstring)."""

    def __init__(self) -> None:
        self._requests: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def popen(self, **kwargs) -> subprocess.Popen:
        if threading.current_thread() is self._thread:
            return self._spawn(kwargs)
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="ordeal-spawner", daemon=True)
                self._thread.start()
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._requests.put((kwargs, future))
        return future.result()

    @staticmethod
    def _spawn(kwargs: dict) -> subprocess.Popen:
        process = subprocess.Popen(preexec_fn=_die_with_parent(os.getpid()), start_new_session=True,
                                   close_fds=True, **kwargs)
        reaper.track(process.pid, process.pid)
        return process

    def _serve(self) -> None:
        while True:  # forever: this thread's death would SIGKILL every child it forked
            kwargs, future = self._requests.get()
            try:
                future.set_result(self._spawn(kwargs))
            except BaseException as error:  # noqa: BLE001 - handed to the caller
                future.set_exception(error)


_spawner = _Spawner()


def spawn(argv: Sequence[str], **kwargs) -> subprocess.Popen:
    """Popen with the no-orphan guarantees (own process group, PDEATHSIG, tracked by the reaper)."""
    reaper.install()  # here, in the caller's thread: signal handlers can only be set from the main thread
    return _spawner.popen(args=list(argv), **kwargs)


def port_accepts(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:])


class Node:
    """The interface every node handle has (docs/architecture.md, "Topology")."""

    name: str
    role: str
    host: str
    port: int
    log_path: Path
    data_dir: Path

    @property
    def pid(self) -> int | None:
        raise NotImplementedError

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> None:
        raise NotImplementedError

    def stop(self, timeout: float = 10.0) -> None:
        raise NotImplementedError

    def kill(self) -> None:
        raise NotImplementedError

    def pause(self) -> None:
        raise NotImplementedError

    def resume(self) -> None:
        raise NotImplementedError

    def restart(self, timeout: float = 10.0, ready_timeout: float | None = 30.0) -> None:
        self.stop(timeout)
        self.start()
        if ready_timeout is not None:
            self.wait_ready(ready_timeout)

    def is_alive(self) -> bool:
        raise NotImplementedError

    def wait_ready(self, timeout: float = 30.0) -> None:
        raise NotImplementedError

    def describe(self) -> dict:
        return {"name": self.name, "role": self.role, "host": self.host, "port": self.port,
                "pid": self.pid, "log": str(self.log_path), "data_dir": str(self.data_dir)}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} {self.address} pid={self.pid}>"


class ProcessNode(Node):
    """A node that is one local process (plus whatever it forks, all in its process group).

    ready_check(node) -> bool decides readiness; the default is "the TCP port accepts"."""

    def __init__(self, name: str, role: str, host: str, port: int, argv: Sequence[str], *,
                 log_path: Path, data_dir: Path, env: Mapping[str, str] | None = None,
                 cwd: Path | None = None, ready_check: Callable[[ProcessNode], bool] | None = None,
                 after_ready: Callable[[ProcessNode], None] | None = None) -> None:
        self.name, self.role, self.host, self.port = name, role, host, port
        self.argv = [str(a) for a in argv]
        self.log_path, self.data_dir = Path(log_path), Path(data_dir)
        self.env = dict(env) if env is not None else None
        self.cwd = Path(cwd) if cwd else self.data_dir
        self.ready_check = ready_check or (lambda node: port_accepts(node.host, node.port))
        self.after_ready = after_ready
        self.paused = False
        self.started_at: float | None = None
        self.log_offset = 0  # where this run's output starts in the (appended) log
        self._process: subprocess.Popen | None = None
        # Whether its being down was asked for (a stop, a kill, a fault that makes it exit): how an exit nobody
        # asked for is told apart (harness/death_watch.py); ``exit_reported``: that exit is recorded once.
        self.down_on_purpose = False
        self.exit_reported = False
        # harness/disk.py DiskHolder: the data dir is a size-limited fs inside the holder's mount namespace,
        # and the node starts in that namespace (faults/disk.py disk_full); None: the host's file system.
        self.disk = None

    @property
    def data_view(self) -> Path:
        """Where the harness reaches the node's data dir as the node sees it."""
        return self.disk.view(self.data_dir) if self.disk is not None else self.data_dir

    @property
    def pid(self) -> int | None:
        return self._process.pid if self.is_alive() else None

    def is_alive(self) -> bool:
        if self._process is None:
            return False
        if self._process.poll() is None:
            return True
        # It died on its own (crash, fault).  Once: end whatever it left in its process group, then forget
        # the pid, so nothing ever signals that number again after the kernel reuses it.
        if self._process.pid in reaper.tracked():
            reaper.kill_group(self._process.pid, signal.SIGKILL)
            reaper.untrack(self._process.pid)
        return False

    def start(self) -> None:
        if self.is_alive():
            raise NodeError(f"{self.name}: already running (pid {self._process.pid})")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.env} if self.env is not None else None
        with open(self.log_path, "ab") as log:
            self.log_offset = log.tell()
            log.write(f"=== ordeal: start {time.strftime('%H:%M:%S')} {' '.join(self.argv)}\n".encode())
            log.flush()
            argv = self.disk.wrap(self.argv, self.cwd) if self.disk is not None else self.argv
            self._process = spawn(argv, env=env, cwd=self.cwd, stdin=subprocess.DEVNULL,
                                  stdout=log, stderr=subprocess.STDOUT)
        self.paused = False
        self.started_at = time.monotonic()
        self.down_on_purpose = False
        self.exit_reported = False

    def expect_exit(self) -> None:
        """The node is about to exit on purpose (a fault that makes it kill itself): no unplanned exit."""
        self.down_on_purpose = True

    def exit_status(self) -> int | None:
        """The exit status of its last process (negative: the signal that ended it), None while it runs."""
        return self._process.returncode if self._process is not None else None

    def log_since_start(self) -> str:
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self.log_offset)
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if not self.is_alive():
                code = self._process.returncode if self._process else None
                raise NodeError(f"{self.name} is not running (exit code {code}); log {self.log_path}:\n"
                                f"{log_tail(self.log_path)}")
            if self.ready_check(self):
                break
            if time.monotonic() > deadline:
                raise NodeError(f"{self.name} ({self.address}) not ready after {timeout:.1f} s; log "
                                f"{self.log_path}:\n{log_tail(self.log_path)}")
            time.sleep(0.05)
        if self.after_ready:
            self.after_ready(self)

    def _signal(self, sig: int) -> None:
        if self._process is not None and not reaper.kill_group(self._process.pid, sig):
            try:
                self._process.send_signal(sig)
            except ProcessLookupError:
                pass

    def pause(self) -> None:
        """SIGSTOP the group; returns once the kernel shows the process stopped (delivery is async)."""
        self._require_alive("pause")
        self._signal(signal.SIGSTOP)
        self.paused = True
        self._await_state(stopped=True)

    def resume(self) -> None:
        self._require_alive("resume")
        self._signal(signal.SIGCONT)
        self.paused = False
        self._await_state(stopped=False)

    def _await_state(self, stopped: bool, timeout: float = 2.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with open(f"/proc/{self._process.pid}/stat") as stat:
                    state = stat.read().rsplit(")", 1)[1].split()[0]
            except OSError:
                return  # gone: nothing left to wait for
            if (state == "T") == stopped:
                return
            time.sleep(0.005)
        raise NodeError(f"{self.name}: process did not {'stop' if stopped else 'continue'} within {timeout} s")

    def stop(self, timeout: float = 10.0) -> None:
        """Graceful: SIGTERM (and SIGCONT, in case it is paused), SIGKILL after ``timeout``."""
        self.down_on_purpose = True
        if self._process is None:
            return
        if self._process.poll() is None:
            self._signal(signal.SIGTERM)
            self._signal(signal.SIGCONT)
            try:
                self._process.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self._finish()

    def kill(self) -> None:
        """SIGKILL the whole process group and wait until the process is gone."""
        self.down_on_purpose = True
        if self._process is None:
            return
        self._finish()

    def _finish(self) -> None:
        process = self._process
        if process.pid in reaper.tracked():  # not yet found dead by is_alive()
            reaper.kill_group(process.pid, signal.SIGKILL)  # also any leftovers of the group
        process.wait()
        reaper.untrack(process.pid)
        self.paused = False

    def _require_alive(self, action: str) -> None:
        if not self.is_alive():
            raise NodeError(f"{self.name}: cannot {action}, the process is not running")
