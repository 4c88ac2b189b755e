"""The shared local Spark Connect server: started on demand, reused by every command, stopped when idle.

Lifecycle (docs/report.md, "The Spark the checks run on"):

- A **watchdog** process (``python -m spark_checkers.engine.connect_server serve``, its own session, detached from
  the command that started it) launches the server JVM (``spark-submit`` of pyspark's SparkConnectServer, bound
  to 127.0.0.1 on a free port) as its child with ``PR_SET_PDEATHSIG``: the JVM cannot outlive the watchdog.
- Every client holds a **lease**: a shared ``flock`` on ``lease.lock`` for as long as its process lives.  The
  kernel drops the lock when the process dies, however it dies (SIGKILL included), in any PID namespace.
- The watchdog polls the lease every second; when no client has held it for ``idle_timeout_s`` it stops the
  JVM (SIGTERM to its process group, then SIGKILL) and exits.  So a server that a command started and that
  command then died is still ended by the server side, not by the dying client.
- ``alive.lock``: held exclusively by the watchdog while it lives (a stale state file is recognised by it).
  ``stop.request``: written by ``ordeal spark stop``; the watchdog polls it (works across PID namespaces).
- A stopping server (``stop.request`` written, or ``status`` "stopping" in the state) takes no new client: one that
  arrives waits until it has ended and starts a new one, never connecting to the dying JVM.
- **Namespaces**: ``ordeal run`` runs inside a private network namespace that has only its own loopback.  The
  watchdog also serves a Unix socket bridged to the server's TCP port; a client in another network namespace
  forwards a loopback port of its own to that socket (file systems are shared, networks are not).

State lives in ``$ORDEAL_CACHE_DIR/spark-connect/`` (default ``~/.cache/ordeal``).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from spark_checkers.engine.settings import DEFAULT_MASTER, server_conf

DEFAULT_IDLE_TIMEOUT_S = 600.0
READY_TIMEOUT_S = 180.0
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
ARCHIVE_ENV = "ORDEAL_SPARK_CLASS_ARCHIVE"  # "0": no class-data sharing archive (ClassArchive)
ARCHIVE_GRACE_S = 120.0  # a stopping JVM writing its archive takes well under this (docs/measurements.md)
STALE_PART_S = 600.0  # a temporary archive this old was left by a JVM that was killed while writing it


class ConnectServerError(RuntimeError):
    """The managed server could not be started or reached (the message says why and where its log is)."""


def state_dir() -> Path:
    return cache_root() / "spark-connect"


def idle_timeout_s() -> float:
    raw = os.environ.get("ORDEAL_SPARK_IDLE_TIMEOUT", str(DEFAULT_IDLE_TIMEOUT_S))
    try:
        value = float(raw)
    except ValueError:
        raise ConnectServerError(f"$ORDEAL_SPARK_IDLE_TIMEOUT={raw!r}: expected seconds (a number > 0)") from None
    if value <= 0:
        raise ConnectServerError(f"$ORDEAL_SPARK_IDLE_TIMEOUT={raw!r}: expected seconds (a number > 0)")
    return value


def net_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/net")
    except OSError:
        return "unknown"


@dataclass(frozen=True)
class Paths:
    root: Path

    @property
    def state(self) -> Path:
        return self.root / "state.json"

    @property
    def alive(self) -> Path:
        return self.root / "alive.lock"

    @property
    def lease(self) -> Path:
        return self.root / "lease.lock"

    @property
    def start(self) -> Path:
        return self.root / "start.lock"

    @property
    def stop_request(self) -> Path:
        return self.root / "stop.request"

    @property
    def socket(self) -> Path:
        return self.root / "bridge.sock"

    @property
    def log(self) -> Path:
        return self.root / "server.log"

    @property
    def warm_up(self) -> Path:
        return self.root / "warm-up.json"


def paths() -> Paths:
    root = state_dir()
    root.mkdir(parents=True, exist_ok=True)
    return Paths(root)


def _open_lock(path: Path) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)


def watchdog_alive(p: Paths) -> bool:
    """True while a watchdog holds alive.lock (a shared probe never blocks it for long)."""
    fd = _open_lock(p.alive)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as error:
        if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return True
        raise
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def read_state(p: Paths) -> dict | None:
    try:
        return json.loads(p.state.read_text())
    except (OSError, ValueError):
        return None


def _write_state(p: Paths, state: dict) -> None:
    tmp = p.state.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    os.replace(tmp, p.state)


# --- Client side -------------------------------------------------------------------------------------------

_lease_fd: int | None = None
_bridges: dict[str, tuple[int, threading.Thread]] = {}
_client_lock = threading.Lock()


def hold_lease(p: Paths) -> None:
    """Hold a shared lease until this process ends: the server is in use while any lease is held.  Blocks while
    an idle watchdog is shutting down (it holds the lease exclusively then), so nobody connects to a dying one."""
    global _lease_fd
    if _lease_fd is not None:
        return
    fd = _open_lock(p.lease)
    fcntl.flock(fd, fcntl.LOCK_SH)
    _lease_fd = fd


def release_lease() -> None:
    """Give the lease back (tests; a process that ends releases it anyway)."""
    global _lease_fd
    if _lease_fd is not None:
        with contextlib.suppress(OSError):
            os.close(_lease_fd)
        _lease_fd = None


def ensure_started(*, wait: bool = True, timeout: float = READY_TIMEOUT_S, master: str | None = None) -> dict:
    """Start the shared server unless one is alive; with ``wait``, return its state once it accepts clients.
    The caller holds a lease from here on."""
    p = paths()
    hold_lease(p)
    while True:
        if not wait and watchdog_alive(p) and _stopping(p, state := read_state(p) or {}):
            return state  # a start begun in the background only: the waiting call outwaits it
        _outwait_stopping(p)
        if not watchdog_alive(p):
            fd = _open_lock(p.start)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)  # one starter at a time; the others find it alive
                if not watchdog_alive(p):
                    _spawn_watchdog(p, master)
            finally:
                os.close(fd)
        if not wait:
            return read_state(p) or {}
        try:
            return wait_ready(p, timeout)
        except _Stopping:
            continue  # the server began to stop (`ordeal spark stop`) just now: a new one once it has ended


class _Stopping(Exception):
    """The server a client waits for is stopping."""


def _stopping(p: Paths, state: dict) -> bool:
    """Whether the server is stopping, or asked to (its watchdog notices within a second)."""
    return state.get("status") == "stopping" or p.stop_request.exists()


def _outwait_stopping(p: Paths, timeout: float = ARCHIVE_GRACE_S + 30) -> None:
    """Wait until a stopping server has ended: a client never connects to a dying one.  A live watchdog without a
    state file is one in its last moment (it removes the file, then lets alive.lock go) or its first (it takes the
    lock, then writes the file): waited for too, or the client would find neither a server to use nor a reason to
    start one."""
    deadline = time.monotonic() + timeout
    while watchdog_alive(p) and ((state := read_state(p)) is None or _stopping(p, state)):
        if time.monotonic() > deadline:
            raise ConnectServerError(f"the stopping Spark Connect server did not end within {timeout:.0f} s; "
                                     f"see {p.log}")
        time.sleep(0.1)


def _spawn_watchdog(p: Paths, master: str | None) -> None:
    with contextlib.suppress(FileNotFoundError):
        p.stop_request.unlink()
    with contextlib.suppress(FileNotFoundError):
        p.state.unlink()
    argv = [sys.executable, "-m", "spark_checkers.engine.connect_server", "serve", "--idle-timeout", str(idle_timeout_s())]
    if master:
        argv += ["--master", master]
    log = open(p.log, "ab")  # noqa: SIM115 - handed to the child
    try:
        # Its own session: the watchdog outlives the command that started it (that is the point), and a
        # terminal's Ctrl-C to the command does not reach it.
        subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                         cwd="/", env={**os.environ, "ORDEAL_CACHE_DIR": str(p.root.parent)})
    finally:
        log.close()
    deadline = time.monotonic() + 30
    while not watchdog_alive(p):  # keep start.lock until it holds alive.lock: no second starter
        if time.monotonic() > deadline:
            raise ConnectServerError(f"the Spark Connect watchdog did not start within 30 s; see {p.log}")
        time.sleep(0.05)


def wait_ready(p: Paths, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        state = read_state(p)
        alive = watchdog_alive(p)
        if state and alive and _stopping(p, state):
            raise _Stopping
        if state and state.get("status") == "ready" and alive:
            return state
        if not alive:
            reason = (state or {}).get("error") or "the watchdog exited"
            raise ConnectServerError(f"the local Spark Connect server did not start: {reason}; see {p.log}")
        if time.monotonic() > deadline:
            raise ConnectServerError(f"the local Spark Connect server was not ready within {timeout:.0f} s; "
                                     f"see {p.log}")
        time.sleep(0.1)


def local_endpoint(state: dict) -> str:
    """``sc://127.0.0.1:PORT`` reachable from this process: the server's own port in its network namespace,
    else a loopback port of ours forwarded to the watchdog's Unix socket."""
    if state.get("netns") == net_namespace():
        return f"sc://127.0.0.1:{state['port']}"
    target = state["socket"]
    with _client_lock:
        known = _bridges.get(target)
        if known is None or not known[1].is_alive():
            listener = socket.create_server(("127.0.0.1", 0))
            thread = threading.Thread(target=_accept_loop, args=(listener, lambda: _connect_unix(target)),
                                      name="spark-connect-bridge", daemon=True)
            thread.start()
            known = (listener.getsockname()[1], thread)
            _bridges[target] = known
    return f"sc://127.0.0.1:{known[0]}"


def _connect_unix(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    return s


def _accept_loop(listener: socket.socket, connect) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        try:
            upstream = connect()
        except OSError:
            client.close()
            continue
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pump, args=(a, b), daemon=True).start()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while True:
            data = source.recv(1 << 16)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)
        with contextlib.suppress(OSError):
            source.close()


def status() -> dict:
    """What ``ordeal spark status`` prints."""
    p = paths()
    state = read_state(p) or {}
    alive = watchdog_alive(p)
    out = {"running": alive, "state_dir": str(p.root)}
    if alive:
        out.update({k: state.get(k) for k in ("status", "port", "watchdog_pid", "jvm_pid", "master", "netns",
                                               "idle_timeout_s", "started_unix", "idle_since_unix", "log")})
        if state.get("writing_archive"):
            out["writing_archive"] = state["writing_archive"]
        out["in_use"] = lease_busy(p)
        out["endpoint_here"] = local_endpoint(state) if state.get("status") == "ready" else None
        out["warmed_up"] = warmed_up(p, state)
    return out


def record_warm_up(p: Paths, state: dict, checks: list[dict]) -> None:
    """Note that this server (by its start time) ran ``ordeal spark start --warm-up``'s checks."""
    p.warm_up.write_text(json.dumps({"server_started_unix": state.get("started_unix"), "finished_unix": time.time(),
                                     "checks": checks}, indent=2))


def warmed_up(p: Paths, state: dict) -> dict | None:
    """The warm-up record of the server that runs now (a record of an earlier server is not its own)."""
    try:
        record = json.loads(p.warm_up.read_text())
    except (OSError, ValueError):
        return None
    return record if record.get("server_started_unix") == state.get("started_unix") else None


def lease_busy(p: Paths) -> bool:
    fd = _open_lock(p.lease)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return True
        raise
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def stop(timeout: float = ARCHIVE_GRACE_S + 30, notify: Callable[[str], None] | None = None) -> bool:
    """Ask the watchdog to stop the server; wait until it is gone.  False when none was running.  ``notify`` is
    told once why the wait is long, when it is: the stopping JVM writes the class archive (ClassArchive)."""
    p = paths()
    if not watchdog_alive(p):
        return False
    asked = (read_state(p) or {}).get("watchdog_pid")
    p.stop_request.write_text(str(time.time()))
    deadline = time.monotonic() + timeout
    told = notify is None
    # Wait for the watchdog that was asked, not for alive.lock to be free: a client that arrives meanwhile starts a
    # new server the moment the old one lets the lock go, and that one is the client's, not this stop's (waiting
    # for it would wait for its idle timeout).
    while watchdog_alive(p) and (asked is None or _pid_running(asked)):
        if time.monotonic() > deadline:
            raise ConnectServerError(f"the Spark Connect watchdog did not stop within {timeout:.0f} s; see {p.log}")
        if not told and (writing := (read_state(p) or {}).get("writing_archive")):
            notify(f"the stopping server's JVM writes its class archive {writing}: once per pyspark installation and "
                   f"setting, 10-20 s, so that later servers start sooner (${ARCHIVE_ENV}=0 turns it off)")
            told = True
        time.sleep(0.1)
    return True


def _pid_running(pid: int) -> bool:
    """Whether the process lives (a zombie, not yet reaped by the command that started it, has ended)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# --- Server side (the watchdog) ----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as s:
        return s.getsockname()[1]


def _die_with_parent() -> None:
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() == 1:
        os._exit(1)


def cache_root() -> Path:
    """``$ORDEAL_CACHE_DIR``, default ``~/.cache/ordeal``: the server's state, and its JVM's class archive."""
    return Path(os.environ.get("ORDEAL_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "ordeal"))


def archive_dir() -> Path | None:
    """Where the class archive lives (``$ORDEAL_JVM_CACHE_DIR``, default ``<cache root>/jvm``); None when
    ``$ORDEAL_SPARK_CLASS_ARCHIVE=0``.  Checked at start-up: anything else is a usage error."""
    raw = os.environ.get(ARCHIVE_ENV, "1")
    if raw not in ("0", "1"):
        raise ConnectServerError(f"${ARCHIVE_ENV}={raw!r}: expected 1 (keep a class archive, the default) or 0 "
                                 "(none)")
    if raw == "0":
        return None
    root = Path(os.environ.get("ORDEAL_JVM_CACHE_DIR") or cache_root() / "jvm")
    if root.exists() and not root.is_dir():
        raise ConnectServerError(f"$ORDEAL_JVM_CACHE_DIR={str(root)!r} is not a directory: give a directory (made "
                                 "if missing) for the Spark server's class archive, or set "
                                 f"{ARCHIVE_ENV}=0")
    return root


@dataclass
class ClassArchive:
    """The server JVM's class-data sharing archive (Java 17's dynamic CDS): the classes one server loaded, which the
    next server's JVM maps instead of loading, linking and verifying them again: a new server starts, and runs
    its first check, seconds sooner (docs/measurements.md).

    One archive per pyspark installation and setting (its directory and jars, Java, the JVM's flags and memory),
    in ``archive_dir()``; a JSON file beside it names them, and archives of a pyspark installation that is gone,
    or of an older one in the same place, are removed.  A server with no archive writes one when it stops (its
    JVM, at exit: some seconds and a few hundred MB) under a temporary name, renamed only when the JVM ended by itself: a
    truncated archive crashes the JVM that maps it (SIGBUS, even with -XX:+VerifySharedSpaces), while one that
    does not match is refused with a warning; the server then removes it, so that its successor writes a new one.
    ``$ORDEAL_SPARK_CLASS_ARCHIVE=0``: neither used nor written."""
    path: Path
    part: Path
    using: bool
    writing: bool

    @classmethod
    def for_server(cls) -> ClassArchive:
        import hashlib

        import pyspark  # here, not at the top: `ordeal spark status|stop` import this module without pyspark's cost

        root = archive_dir()
        if root is None:
            return cls(Path(os.devnull), Path(os.devnull), False, False)
        conf = server_conf()
        java = os.path.realpath(os.path.join(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME")
                                else shutil.which("java") or "java")
        home = os.path.realpath(os.path.dirname(pyspark.__file__))
        jars = os.path.join(home, "jars")
        key = {"pyspark": home, "version": pyspark.__version__,
               "jars_mtime_ns": os.stat(jars).st_mtime_ns if os.path.isdir(jars) else None, "java": java,
               "java_options": conf.get("spark.driver.extraJavaOptions"), "memory": conf.get("spark.driver.memory")}
        name = f"spark-connect-{hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]}.jsa"
        path = root / name
        part = path.with_name(f"{path.name}.{os.getpid()}.part")
        root.mkdir(parents=True, exist_ok=True)
        _prune_archives(root, key, path)
        using = path.exists()
        if not using:
            path.with_suffix(".json").write_text(json.dumps(key, indent=1, sort_keys=True) + "\n")
        return cls(path, part, using, not using)

    def options(self) -> tuple[str, ...]:
        if self.using:
            return (f"-XX:SharedArchiveFile={self.path}",)
        if self.writing:
            # At exit the JVM warns once per class it leaves out (each class Spark generated: thousands of lines).
            return (f"-XX:ArchiveClassesAtExit={self.part}", "-Xlog:cds=error")
        return ()

    def discard(self) -> None:
        """The archive made the JVM fail: removed, and a new one written when this server stops."""
        self._remove()
        self.writing = True

    def _remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self.using = False

    def refused_by(self, jvm_pid: int) -> bool:
        """True when this archive was meant to be mapped but the running JVM did not map it (it refused an archive
        that does not match it, with a warning in the log): then it is removed, so that the next server writes one
        that does."""
        if not self.using:
            return False
        try:
            mapped = str(self.path) in Path(f"/proc/{jvm_pid}/maps").read_text()
        except OSError:
            return False  # the JVM is gone: nothing to learn here
        if not mapped:
            self._remove()
        return not mapped

    def settle(self, returncode: int | None) -> None:
        """After the JVM ended: keep what it wrote if it ended by itself (0, or 143 after the SIGTERM)."""
        if not self.writing or not self.part.exists():
            return
        if returncode in (0, 143):
            os.replace(self.part, self.path)
            print(f"class archive written: {self.path}", flush=True)
        else:
            self.part.unlink()


def _prune_archives(root: Path, key: dict, keep: Path) -> None:
    """Remove what no server will map again: temporary archives of a JVM killed while writing, and archives of a
    pyspark installation that is gone, or that was replaced in the same place (its key differs)."""
    for old in root.glob("*.part"):
        with contextlib.suppress(OSError):
            if time.time() - old.stat().st_mtime > STALE_PART_S:
                old.unlink()
    for described in root.glob("spark-connect-*.json"):
        archive = described.with_suffix(".jsa")
        if archive == keep:
            continue
        try:
            theirs = json.loads(described.read_text())
            replaced = theirs["pyspark"] == key["pyspark"] and any(theirs[k] != key[k] for k in ("version",
                                                                                                  "jars_mtime_ns"))
            gone = replaced or not os.path.isdir(theirs["pyspark"])
        except (OSError, ValueError, KeyError, TypeError):
            gone = True  # not ours to read: an archive nobody can tell the origin of is not mapped either
        if gone:
            for f in (archive, described):
                with contextlib.suppress(FileNotFoundError):
                    f.unlink()


def server_argv(port: int, master: str, java_options: tuple[str, ...] = ()) -> list[str]:
    import pyspark  # here, not at the top: see ClassArchive.for_server

    home = Path(pyspark.__file__).parent
    argv = [str(home / "bin" / "spark-submit"), "--class", SERVER_CLASS, "--master", master,
            "--name", "ordeal-spark-connect",
            "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
            "--conf", f"spark.connect.grpc.binding.port={port}",
            "--conf", "spark.log.level=WARN"]  # INFO logs every RPC: the log of a long-lived server would grow
    for key, value in server_conf().items():
        if key == "spark.driver.extraJavaOptions":
            value = " ".join([value, *java_options])
        argv += ["--conf", f"{key}={value}"]
    return [*argv, "spark-internal"]


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def serve(idle_timeout: float, master: str) -> int:
    p = paths()
    alive_fd = _open_lock(p.alive)
    deadline = time.monotonic() + 5
    while True:  # a client's shared probe may hold it for a moment
        try:
            fcntl.flock(alive_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except OSError:
            if time.monotonic() > deadline:
                print("another watchdog holds alive.lock: exiting", flush=True)
                return 0
            time.sleep(0.02)
    port = _free_port()
    state = {"status": "starting", "port": port, "watchdog_pid": os.getpid(), "jvm_pid": None, "master": master,
             "netns": net_namespace(), "socket": str(p.socket), "idle_timeout_s": idle_timeout,
             "started_unix": time.time(), "idle_since_unix": None, "log": str(p.log)}
    _write_state(p, state)
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    env.pop("SPARK_HOME", None)  # pyspark's own
    print(f"{time.strftime('%H:%M:%S')} starting the Spark Connect server on 127.0.0.1:{port} ({master}), "
          f"idle timeout {idle_timeout:.0f} s", flush=True)
    archive = ClassArchive.for_server()
    # A JVM that crashes (a bad archive: SIGBUS) writes its report here, not into the directory it started in.
    crash_log = f"-XX:ErrorFile={p.root / 'hs_err_pid%p.log'}"

    def launch() -> subprocess.Popen:
        started = subprocess.Popen(server_argv(port, master, (*archive.options(), crash_log)),
                                   stdin=subprocess.DEVNULL, env=env, process_group=0,
                                   preexec_fn=_die_with_parent)  # noqa: PLW1509 - the JVM dies with the watchdog
        state["jvm_pid"] = started.pid
        _write_state(p, state)
        return started

    jvm = launch()
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stopping.set())
    try:
        ready_deadline = time.monotonic() + READY_TIMEOUT_S
        while not _port_open(port):
            if jvm.poll() is not None and archive.using and not stopping.is_set():
                # The JVM died while starting with the archive mapped: whatever is wrong with the archive (a
                # truncated one crashes it with SIGBUS), a server without one is better.  Once.
                print(f"the server JVM exited with {jvm.returncode} while starting with {archive.path}: "
                      "starting it again without the archive (removed)", flush=True)
                archive.discard()
                jvm = launch()
                continue
            if jvm.poll() is not None or stopping.is_set() or time.monotonic() > ready_deadline:
                why = (f"the server JVM exited with {jvm.returncode}" if jvm.poll() is not None
                       else "stopped while starting" if stopping.is_set()
                       else f"port {port} not open after {READY_TIMEOUT_S:.0f} s")
                state.update(status="failed", error=why)
                _write_state(p, state)
                print(why, flush=True)
                return 1
            time.sleep(0.1)
        with contextlib.suppress(FileNotFoundError):
            p.socket.unlink()
        bridge = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        bridge.bind(str(p.socket))
        bridge.listen(64)
        threading.Thread(target=_accept_loop, args=(bridge, lambda: socket.create_connection(("127.0.0.1", port))),
                         daemon=True).start()
        state["status"] = "ready"
        _write_state(p, state)
        print(f"{time.strftime('%H:%M:%S')} ready", flush=True)
        if archive.refused_by(jvm.pid):
            print(f"the server JVM did not map the class archive {archive.path} (see its warning above): removed, "
                  "the next server writes a new one", flush=True)
        last_busy = time.monotonic()
        lease_fd = _open_lock(p.lease)
        while not stopping.is_set():
            if jvm.poll() is not None:
                print(f"the server JVM exited with {jvm.returncode}", flush=True)
                break
            if p.stop_request.exists():
                print(f"{time.strftime('%H:%M:%S')} stop requested", flush=True)
                break
            try:
                fcntl.flock(lease_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # a client holds a lease: in use
                last_busy = time.monotonic()
                if state["idle_since_unix"] is not None:
                    state["idle_since_unix"] = None
                    _write_state(p, state)
            else:
                # Nobody holds a lease.  Keep it exclusively while deciding (and, if idle, while stopping), so
                # a client arriving now waits instead of connecting to a dying server.
                if time.monotonic() - last_busy >= idle_timeout:
                    print(f"{time.strftime('%H:%M:%S')} idle for {idle_timeout:.0f} s: stopping", flush=True)
                    break
                fcntl.flock(lease_fd, fcntl.LOCK_UN)
                if state["idle_since_unix"] is None:
                    state["idle_since_unix"] = time.time() - (time.monotonic() - last_busy)
                    _write_state(p, state)
            stopping.wait(1.0)
        return 0
    finally:
        if state["status"] == "ready":  # what `ordeal spark stop` and `status` tell while the JVM ends
            state["status"] = "stopping"
            if archive.writing and jvm.poll() is None:
                state["writing_archive"] = str(archive.path)
            _write_state(p, state)
        _terminate(jvm, grace=ARCHIVE_GRACE_S if archive.writing else 15)
        archive.settle(jvm.returncode)
        with contextlib.suppress(FileNotFoundError):
            p.socket.unlink()
        with contextlib.suppress(FileNotFoundError):
            p.stop_request.unlink()
        with contextlib.suppress(FileNotFoundError):
            p.state.unlink()
        os.close(alive_fd)  # releases alive.lock; then (process exit) the lease lock
        print(f"{time.strftime('%H:%M:%S')} stopped", flush=True)


def _terminate(jvm: subprocess.Popen, grace: float = 15) -> None:
    """SIGTERM the JVM's process group, SIGKILL it after ``grace`` seconds."""
    if jvm.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(jvm.pid, signal.SIGTERM)
        try:
            jvm.wait(grace)
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(jvm.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        jvm.wait(5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spark_checkers.engine.connect_server")
    sub = parser.add_subparsers(dest="command", required=True)
    serve_p = sub.add_parser("serve", help="run the watchdog and the server in the foreground")
    serve_p.add_argument("--idle-timeout", type=float, default=DEFAULT_IDLE_TIMEOUT_S)
    serve_p.add_argument("--master", default=None)
    args = parser.parse_args(argv)
    return serve(args.idle_timeout, args.master or DEFAULT_MASTER)


if __name__ == "__main__":
    sys.exit(main())
