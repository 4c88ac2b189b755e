"""A private network namespace for a run, so network faults are real kernel packet drops that vanish
with the run, and no two runs (or two engineers' test sessions) can ever collide on a port.

Two ways in:
- ``enter_private_netns()``: unshare(CLONE_NEWNET) on the current process, before it starts any thread
  (a namespace switch applies to the calling thread only; threads started afterwards inherit it).
  Used by tests/conftest.py at import time.  Children inherit the namespace and die with the harness
  through PDEATHSIG (harness/node.py).
- ``reexec_isolated(argv)`` (``ordeal up --isolated``): replace this process by
  ``unshare --net --pid --fork --kill-child --mount-proc -- argv``.  The run then also has its own PID
  namespace: when the ``ordeal`` process is SIGKILLed, unshare's child (PID 1 of the namespace) is
  killed and the kernel kills everything else in it, grandchildren included; the network namespace
  disappears with its last process."""

from __future__ import annotations

import ctypes
import fcntl
import os
import shutil
import socket
import struct
import threading

CLONE_NEWNET = 0x40000000
MARKER = "ORDEAL_NETNS"  # set (to "private") in the environment once the process is in its own netns
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1


class IsolationUnavailable(RuntimeError):
    """The private network namespace cannot be used here."""


REFUSAL = ("network isolation needs root (a private network namespace via unshare(CLONE_NEWNET)); "
           "this process runs as uid {uid}. Run as root (e.g. sudo), or run without --isolated: process "
           "faults still work on 127.0.0.1, network faults (partitions, lossy links) are refused.")


def is_root() -> bool:
    return os.geteuid() == 0


def in_private_netns() -> bool:
    return os.environ.get(MARKER) == "private"


def can_isolate() -> bool:
    return in_private_netns() or is_root()


def refusal_message() -> str:
    return REFUSAL.format(uid=os.geteuid())


def require_isolation(what: str) -> None:
    """For features that only make sense inside the private namespace (network faults)."""
    if not in_private_netns():
        reason = refusal_message() if not is_root() else "the run was not started isolated"
        raise IsolationUnavailable(f"{what} needs the run's private network namespace: {reason}")


def _bring_loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sh", b"lo", 0)
        flags = struct.unpack("16sh", fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sh", b"lo", flags | IFF_UP))


def enter_private_netns() -> bool:
    """Move this process into a fresh network namespace with only ``lo`` (up).  Returns False when it
    already is in one (idempotent), raises IsolationUnavailable when it cannot."""
    if in_private_netns():
        return False
    if not is_root():
        raise IsolationUnavailable(refusal_message())
    if threading.active_count() > 1:
        raise IsolationUnavailable(
            f"enter_private_netns() must run before any thread starts ({threading.active_count()} "
            "threads running): unshare switches only the calling thread's namespace.")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise IsolationUnavailable(f"unshare(CLONE_NEWNET) failed: {os.strerror(errno)}")
    _bring_loopback_up()
    os.environ[MARKER] = "private"
    return True


def isolated_argv(argv: list[str]) -> list[str]:
    unshare = shutil.which("unshare")
    if unshare is None:
        raise IsolationUnavailable("`unshare` (util-linux) is not installed; apt-get install util-linux")
    return [unshare, "--net", "--pid", "--fork", "--kill-child", "--mount-proc", "--", *argv]


def reexec_isolated(argv: list[str]) -> None:
    """Replace this process by argv inside new network + PID namespaces (does not return)."""
    if not is_root():
        raise IsolationUnavailable(refusal_message())
    full = isolated_argv(argv)
    # the child brings lo up itself (enter_private_netns sees the marker and only does that part)
    os.environ[MARKER] = "reexec"
    os.execv(full[0], full)


def finish_reexec() -> bool:
    """In the re-executed child: bring lo up and mark the namespace private.  True when this process
    is such a child."""
    if os.environ.get(MARKER) != "reexec":
        return False
    _bring_loopback_up()
    os.environ[MARKER] = "private"
    return True
