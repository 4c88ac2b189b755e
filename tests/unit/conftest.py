"""Shared unit-test fixtures.  The Spark session is started once per test session (cold start 7-11 s) and
only when a test asks for it."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def spark():
    from spark_checkers.session import spark_session

    session = spark_session("local[2]")
    try:
        yield session
    finally:
        session.stop()
