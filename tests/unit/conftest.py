"""The unit tier starts no Spark.  A command run in-process (click's CliRunner: `ordeal run`, `check`, `selftest`)
starts the shared Spark Connect server in the background before it even reads its arguments' files, so a test of
a refusal would start a JVM.  Here every test sees ``ORDEAL_SPARK_REMOTE`` naming an endpoint where nothing
listens (port 1): a remote Spark is never started by Ordeal, and a test that reaches Spark after all ends with
"unreachable" (a failure to fix, by moving the test to tests/checkers) instead of a JVM start.  Tests of the
choice itself (tests/unit/test_spark_connect_settings.py) set or clear the variable themselves."""

from __future__ import annotations

import pytest

NO_SPARK = "sc://127.0.0.1:1"


@pytest.fixture(autouse=True)
def _no_spark(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORDEAL_SPARK_REMOTE", NO_SPARK)
    monkeypatch.delenv("ORDEAL_SPARK_MASTER", raising=False)
