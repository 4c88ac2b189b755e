"""A warm Spark compiles no code for a check it has done before.

Every check builds the same queries; their generated Java is the same each time only if nothing in it changes
between checks (PySpark's fresh lambda-variable names did: spark_checkers.job.columns.sql) and Spark's code cache holds
a whole check (spark_checkers.engine.settings.CODEGEN_CACHE_ENTRIES).  Before both, each check of a run compiled its
classes anew (Janino, then the JIT): most of a warm check's fixed cost (docs/measurements.md).  Measured in a fresh classic JVM of its
own, whose compile counter (Spark's CodegenMetrics) no other test touches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spark_checkers import synthetic as s

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json, sys
from spark_checkers.api import check_runs
from spark_checkers.engine.spark_session import spark_session
spark = spark_session("local[2]")
metric = spark._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME()
counts, verdicts = [], []
for _ in range(2):
    before = metric.getCount()
    verdicts.append(check_runs(sys.argv[1:], spark=spark)[0]["verdict"])
    counts.append(metric.getCount() - before)
print(json.dumps({"compiled": counts, "verdicts": verdicts}))
"""


@pytest.mark.nightly  # for its time (about 45 s): what a repeated check costs, not what it answers
def test_a_repeated_check_compiles_no_code(tmp_path):
    # Offline windows, a fault and a lost message: the rules' lookups (offline windows, fault spans, sessions)
    # and the loss path all take part.
    spec = s.Spec(pairs=2, messages=12, offline=(s.Offline(0, 5, 8),), faults=(s.Fault("f1", "kill", "redis-7003", 4, 6),))
    rows = [r for r in s.generate(spec) if not (r["kind"] == "delivery" and r.get("pub_seq") == 3)]
    run = s.write_run(tmp_path / "run", rows, spec)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop("SPARK_CONNECT_MODE_ENABLED", None)
    done = subprocess.run([sys.executable, "-c", PROBE, str(run)], capture_output=True, text=True, env=env,
                          timeout=540, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["verdicts"] == ["fail", "fail"], result  # the planted loss, found both times
    first, second = result["compiled"]
    assert first > 50, f"the probe saw only {first} compilations in a cold check: is the counter read right?"
    assert second == 0, (f"the second check of the same run compiled {second} classes (first: {first}): some "
                         "generated code changes between checks, or the code cache is too small for one check")
