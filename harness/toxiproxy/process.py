"""The proxy process: started in its own process group, its API address read from its first stdout line, ended
by its process group (SIGTERM, then SIGKILL) whatever happened."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5.0


@dataclass
class ToxiproxyProcess:
    """A running proxy: its API at ``api`` ("host:port"), its process ``pid``."""

    process: subprocess.Popen
    api: str
    log_path: Path | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def api_host(self) -> str:
        return self.api.rpartition(":")[0]

    @property
    def api_port(self) -> int:
        return int(self.api.rpartition(":")[2])

    def stop(self) -> None:
        if self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(STOP_TIMEOUT_S)
        if self.process.stdout is not None:
            self.process.stdout.close()


def start_toxiproxy(listen: str = "127.0.0.1:0", log_path: Path | None = None) -> ToxiproxyProcess:
    """Start the proxy with its API on ``listen`` (loopback; port 0: a free one) and wait until it serves."""
    stderr = open(log_path, "ab") if log_path is not None else subprocess.DEVNULL  # noqa: SIM115
    try:
        process = subprocess.Popen([sys.executable, "-m", "harness.toxiproxy", "--listen", listen],
                                   stdout=subprocess.PIPE, stderr=stderr, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
    finally:
        if log_path is not None:
            stderr.close()
    running = ToxiproxyProcess(process, api="", log_path=log_path)
    try:
        ready, _, _ = select.select([process.stdout], [], [], START_TIMEOUT_S)
        line = process.stdout.readline() if ready else b""
        if not line:
            raise RuntimeError(f"the toxiproxy process did not start within {START_TIMEOUT_S} s "
                               f"(exit status {process.poll()}; log: {log_path})")
        running.api = json.loads(line)["api"]
    except BaseException:
        running.stop()
        raise
    return running


@contextlib.contextmanager
def running_toxiproxy(listen: str = "127.0.0.1:0", log_path: Path | None = None) -> Iterator[ToxiproxyProcess]:
    running = start_toxiproxy(listen, log_path)
    try:
        yield running
    finally:
        running.stop()


def wait_api(api: str, timeout_s: float = START_TIMEOUT_S) -> None:
    """Until the API at ``api`` accepts a connection (for a proxy started elsewhere)."""
    import socket

    host, _, port = api.rpartition(":")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=0.5).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
