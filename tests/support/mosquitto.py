"""A Mosquitto of a test's own: started on its config, waited for until a CONNECT gets its CONNACK, and ended by
its process group whatever the test did."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from harness.mqtt_probe import mqtt_connect


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def running_mosquitto(config: Path, port: int, *, tls=None, timeout_s: float = 10.0) -> Iterator[subprocess.Popen]:
    """Mosquitto on ``config`` (its log beside it, mosquitto.log), answering on 127.0.0.1:``port`` (over TLS with
    ``tls``, a harness.tls.ClientTls), for the duration of the block."""
    log_path = config.parent / "mosquitto.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(["mosquitto", "-c", str(config)], stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            deadline = time.monotonic() + timeout_s
            while not mqtt_connect("127.0.0.1", port, tls=tls, timeout_s=1.0).ok:
                assert process.poll() is None, log_path.read_text()
                assert time.monotonic() < deadline, f"mosquitto did not answer{' over TLS' if tls else ''}"
                time.sleep(0.05)
            yield process
        finally:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(5)
