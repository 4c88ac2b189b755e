"""Small observations of the operating system that faults use as evidence."""

from __future__ import annotations

import errno
import os
import socket


def proc_state(pid: int | None) -> str | None:
    """The state letter of /proc/PID/stat ('R', 'S', 'T', 'Z', ...), or None when the process is gone."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as stat:
            text = stat.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may hold spaces and parentheses: the state follows the last ')'.
    return text.rsplit(")", 1)[1].split()[0]


def pid_gone(pid: int | None) -> bool:
    """True when no live process has this PID (gone, or a zombie awaiting its parent)."""
    return proc_state(pid) in (None, "Z", "X")


def is_stopped(pid: int | None) -> bool:
    """True when the process is stopped by a signal (SIGSTOP): state 'T' (or 't' under a tracer), or frozen
    by its cgroup's freezer (a paused container: ``docker/podman pause``)."""
    return proc_state(pid) in ("T", "t") or freezer_state(pid) == "FROZEN"


def freezer_state(pid: int | None) -> str | None:
    """FROZEN / FREEZING / THAWED of the process' cgroup-v1 freezer (cgroup v2: cgroup.freeze 1 -> FROZEN),
    or None when it has none or is gone."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/cgroup") as cgroups:
            lines = cgroups.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _hierarchy, controllers, path = line.split(":", 2)
        try:
            if "freezer" in controllers.split(","):
                with open(f"/sys/fs/cgroup/freezer{path}/freezer.state") as state:
                    return state.read().strip()
            if controllers == "" and path != "/":
                with open(f"/sys/fs/cgroup{path}/cgroup.freeze") as state:
                    if state.read().strip() == "1":
                        return "FROZEN"
        except OSError:
            continue
    return None


def port_state(host: str, port: int, timeout_s: float = 0.5) -> str:
    """'accepts', 'refuses' (RST: nobody listens) or 'silent' (timeout: dropped or host unreachable)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return "accepts"
    except ConnectionRefusedError:
        return "refuses"
    except TimeoutError:
        return "silent"
    except OSError as error:
        return "refuses" if error.errno == errno.ECONNREFUSED else f"error: {os.strerror(error.errno or 0)}"


def listener_pid(root_pid: int | None, host: str, port: int) -> int | None:
    """The process in ``root_pid``'s tree that listens on host:port (the broker behind a wrapper such as the
    external target's ``unshare ... sh``), or None."""
    import psutil

    if root_pid is None:
        return None
    try:
        root = psutil.Process(root_pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    for process in tree:
        try:
            for conn in process.net_connections(kind="tcp"):
                if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port and conn.laddr.ip in (host, "0.0.0.0"):
                    return process.pid
        except psutil.Error:
            continue
    return None
