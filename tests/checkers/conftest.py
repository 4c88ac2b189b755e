"""The checkers tier's ``spark`` fixture: one Spark session for the whole test session (a JVM's cold start is
the dearest step of this tier), started only when a test asks for it."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def spark():
    """A classic local[2] session; a Spark Connect one if this process already made one (a test that checked
    through ``ordeal`` in-process, or an integration test of the same pytest run): pyspark allows no classic
    session in a process once it has a Connect session."""
    import os

    from spark_checkers.engine.spark_session import local_connect_session, spark_session

    connect = "SPARK_CONNECT_MODE_ENABLED" in os.environ
    session = local_connect_session() if connect else spark_session("local[2]")
    try:
        yield session
    finally:
        session.stop()
