"""A standalone master nobody listens on is unavailable at once, naming it (Spark itself retries the registration
for about a minute); one that accepts connections passes the probe."""

from __future__ import annotations

import socket
import time

import pytest

from spark_checkers.engine.spark_session import SparkUnavailable, _probe_standalone
from tests.support.spark_standalone import closed_port


def test_an_unreachable_master_is_unavailable_within_seconds_naming_it():
    master = f"spark://127.0.0.1:{closed_port()}"
    began = time.monotonic()
    with pytest.raises(SparkUnavailable, match=rf"master {master} is unreachable"):
        _probe_standalone(master)
    assert time.monotonic() - began < 5


def test_a_listening_master_passes_and_a_standby_list_needs_one_live_member():
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        _probe_standalone(f"spark://127.0.0.1:{port}")
        _probe_standalone(f"spark://127.0.0.1:{closed_port()},127.0.0.1:{port}")
