"""Every process the harness starts is tracked here, so that nothing outlives the harness.

Three layers, strongest last:
1. Normal teardown: LocalTopology.stop() / Node.stop() end each process and untrack it.
2. This reaper: at interpreter exit (atexit) and on SIGTERM/SIGHUP it SIGKILLs every tracked process
   group that is still registered.
3. The kernel: every child is spawned with PR_SET_PDEATHSIG=SIGKILL (harness/node.py), so it dies
   even when the harness is SIGKILLed and no Python code runs at all. With ``ordeal up --isolated`` the
   whole run also lives in its own PID namespace, which takes every grandchild with it.
Processes are killed by PID / process group only, never by name."""

from __future__ import annotations

import atexit
import os
import signal
import threading

_lock = threading.Lock()
_tracked: dict[int, int] = {}  # pid -> process group id
_installed = False


def track(pid: int, pgid: int) -> None:
    with _lock:
        _tracked[pid] = pgid
    install()


def untrack(pid: int) -> bool:
    """Forget a pid; True when it was tracked until now."""
    with _lock:
        return _tracked.pop(pid, None) is not None


def tracked() -> dict[int, int]:
    with _lock:
        return dict(_tracked)


def kill_group(pgid: int, sig: int = signal.SIGKILL) -> bool:
    """Signal a whole process group; False when the group no longer exists."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return False


def reap_all() -> list[int]:
    """SIGKILL every tracked process group; returns the pids that were still tracked."""
    with _lock:
        victims = dict(_tracked)
        _tracked.clear()
    for pid, pgid in victims.items():
        if not kill_group(pgid):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    for pid in victims:
        try:  # collect our own zombies; the ones that are not our children raise ChildProcessError
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
    return list(victims)


def _on_fatal_signal(signum: int, frame: object) -> None:
    reap_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def install() -> None:
    """Register the exit hooks once.  Signal handlers are only taken when nobody else set one (and
    only from the main thread): a program with its own SIGTERM handling keeps it and calls stop()."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
    atexit.register(reap_all)
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(signum) in (signal.SIG_DFL, None):
            signal.signal(signum, _on_fatal_signal)
