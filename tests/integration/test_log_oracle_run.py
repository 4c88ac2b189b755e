"""The log oracle on a real run: every node of the reference topology (brokers, Redis, Tansu, S3) has its log
in history/logs.parquet; the correct broker's logs pass the default patterns; and the stored run, checked
again by `ordeal check` alone with a declared pattern that fails a line the real broker writes, fails with
that line (node, time, line) as its witness."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from contracts.history_schema import read_log_table
from contracts.scenario import find_scenario
from harness.run import run_scenario
from ordeal.cli import main
from spark_checkers.guarantees import Guarantees
from spark_checkers.rules.logs import judge_logs

pytestmark = pytest.mark.integration

PLANTED = {"name": "planted_stopping", "regex": r"INFO reference_broker: broker \S+ stopping$", "verdict": "fail",
           "roles": ["broker"], "nodes": [], "why": "planted on a real line: the broker's stop", "source": "scenario"}


@pytest.fixture
def out_dir():
    path = Path(tempfile.mkdtemp(prefix="ordeal-logs-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_every_nodes_log_is_in_the_history_and_judged_by_the_declared_patterns(out_dir: Path):
    run_dir = run_scenario(find_scenario("p2p-smoke"), 1, out_dir, check=False).run_dir
    table, sources = read_log_table(run_dir / "history")
    files = {p.stem: p for p in (run_dir / "logs").glob("*.log") if p.stem != "harness-error"}
    assert {s.node for s in sources} == set(files)
    assert {s.role for s in sources} == {"broker", "redis", "kafka", "storage"}
    for source in sources:
        assert not source.error and not source.truncated, source
        assert source.lines == len(files[source.node].read_text(errors="replace").splitlines()) > 0, source
    rows = table.to_pylist()
    assert any(r["node"] == "broker-1" and r["t_mono_us"] is not None and r["line"].endswith("stopping")
               for r in rows)

    planted = out_dir / "planted"
    shutil.copytree(run_dir, planted)
    scenario = json.loads((planted / "scenario.json").read_text())
    scenario["checks"]["logs"]["effective"].insert(0, PLANTED)
    (planted / "scenario.json").write_text(json.dumps(scenario))

    # The correct broker's own logs, judged by the defaults the run declared (the checker's code, without
    # Spark: the fault scenarios' integration test checks real runs through the whole checker).
    real = judge_logs(run_dir / "history", Guarantees.from_scenario(
        json.loads((run_dir / "scenario.json").read_text())).log_patterns)
    assert all(f.count == 0 and f.unknown is None for f in real.values()), {
        k: (f.count, f.unknown, f.witnesses[:1]) for k, f in real.items()}

    result = CliRunner().invoke(main, ["check", str(planted)])  # the stored run alone: no harness, no nodes
    report = json.loads((planted / "report.json").read_text())
    assert result.exit_code == 1 and report["exit_code"] == 1, result.output
    failing = {i["id"]: i for i in report["invariants"] if i["verdict"] == "fail"}
    assert set(failing) == {"logs.error_lines"}, failing
    witness = failing["logs.error_lines"]["witnesses"][0]
    assert witness["data"]["node"] == "broker-1" and witness["data"]["line"].endswith("stopping")
    assert witness["text"].startswith("broker-1 at ") and "planted_stopping" in witness["text"]
    assert "logs.error_lines" in (planted / "report.html").read_text()
