"""The checks on a real Spark standalone cluster (support/spark_standalone.py: the installed pyspark's master and
two workers, JVMs of their own on 127.0.0.1): the anomaly catalog checked in a classic session on the cluster
(``--spark-master spark://...``) and through a Spark Connect server running on it (``ordeal spark start --master
spark://...``) gives the verdicts and counts of ``local[2]``; so does a real run, given as a relative path and as a
``file://`` URI; the executors' Python workers are this venv's; an unreachable master is unknown (exit 2) naming
it, at once; and the cluster leaves no master, worker or executor process behind.  How to run the checks on a
cluster: docs/spark-cluster.md."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

import pytest
from support.anomalies import write_runs
from support.spark_standalone import closed_port, standalone_cluster

from contracts.exit_codes import EXIT_UNKNOWN
from contracts.scenario import find_scenario
from harness.run import run_scenario

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.timeout(1200)]
ORDEAL = [sys.executable, "-m", "ordeal.cli"]
ROOT = Path(__file__).resolve().parents[2]

# check_runs over many runs in one batch (one JVM, one job) in a process of its own: a classic session (a master)
# or the Spark Connect server of $ORDEAL_CACHE_DIR (""); with a master, also the Python executable a task on the
# executors runs under.
CHECK_CHILD = """
import json, sys
from spark_checkers.api import check_runs
from spark_checkers.engine.spark_session import spark_session
spark = spark_session(sys.argv[2] or None)
reports = check_runs(sys.argv[3:], spark=spark)
pythons = []
if sys.argv[2]:
    pythons = sorted(set(spark.sparkContext.parallelize(range(4), 4).map(lambda _: sys.executable).collect()))
open(sys.argv[1], "w").write(json.dumps({"reports": reports, "pythons": pythons}))
"""


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ORDEAL_SPARK_MASTER", "ORDEAL_SPARK_REMOTE")}
    return {**env, **(extra or {})}


def _check_in_child(dirs, out: Path, master: str, env: dict[str, str] | None = None) -> dict:
    done = subprocess.run([sys.executable, "-c", CHECK_CHILD, str(out), master, *map(str, dirs)], cwd=ROOT,
                          capture_output=True, text=True, timeout=1100, env=_env(env))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


def _run(args, env=None, cwd=ROOT, timeout=900):
    return subprocess.run([*ORDEAL, *args], capture_output=True, text=True, cwd=cwd, env=_env(env), timeout=timeout)


def _essence(report: dict) -> dict:
    """What must not depend on the engine: verdicts, counts, witnesses' data, the run's counts."""
    return {"verdict": report["verdict"], "exit_code": report["exit_code"], "counts": report["counts"],
            "invariants": {i["id"]: (i["verdict"], i["count"], i.get("reason"),
                                     [w["data"] for w in i.get("witnesses", [])]) for i in report["invariants"]}}


@pytest.fixture(scope="module")
def cluster_stack(tmp_path_factory):
    """One cluster for the module, as (its ExitStack, the cluster): ``test_the_cluster_leaves_no_process_behind``
    (last) ends it itself; the stack ends it otherwise."""
    with ExitStack() as stack:
        yield stack, stack.enter_context(standalone_cluster(tmp_path_factory.mktemp("spark-standalone")))


@pytest.fixture(scope="module")
def cluster(cluster_stack):
    return cluster_stack[1]


@pytest.fixture(scope="module")
def catalog_dirs(tmp_path_factory):
    return list(write_runs(tmp_path_factory.mktemp("catalog")).values())


@pytest.fixture(scope="module")
def local_catalog(catalog_dirs, tmp_path_factory) -> list[dict]:
    reports = _check_in_child(catalog_dirs, tmp_path_factory.mktemp("local") / "local.json", "local[2]")["reports"]
    assert {r["verdict"] for r in reports} == {"pass", "fail", "unknown"}  # the catalog has all three
    assert reports[0]["environment"]["spark_master"] == "local[2]"
    return reports


@pytest.mark.nightly  # the whole catalog twice (~5 min); CI keeps the real run below
def test_the_cluster_and_local_agree_on_the_anomaly_catalog(cluster, catalog_dirs, local_catalog, tmp_path):
    out = _check_in_child(catalog_dirs, tmp_path / "cluster.json", cluster.master_url, cluster.env)
    reports = out["reports"]
    assert reports[0]["environment"]["spark_master"] == cluster.master_url
    assert out["pythons"] == [sys.executable]  # the executors' Python workers are this venv's
    for d, a, b in zip(catalog_dirs, local_catalog, reports, strict=True):
        assert _essence(a) == _essence(b), d.name
    assert any(app["name"] == "ordeal-checkers" for app in cluster.state()["completedapps"])  # ran there


@pytest.mark.nightly  # the whole catalog twice (~5 min); CI keeps the real run below
def test_a_connect_server_on_the_cluster_agrees_with_local(cluster, catalog_dirs, local_catalog, tmp_path):
    """Its own state directory: never the test session's shared server."""
    env = {**cluster.env, "ORDEAL_CACHE_DIR": str(tmp_path / "cache")}
    started = _run(["spark", "start", "--master", cluster.master_url], env)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        state = json.loads(_run(["spark", "status"], env).stdout)
        assert state["master"] == cluster.master_url
        reports = _check_in_child(catalog_dirs, tmp_path / "connect.json", "", env)["reports"]
    finally:
        stopped = _run(["spark", "stop"], env)
    assert stopped.returncode == 0, stopped.stderr
    assert reports[0]["environment"]["spark_master"].startswith("sc://127.0.0.1:")
    for d, a, b in zip(catalog_dirs, local_catalog, reports, strict=True):
        assert _essence(a) == _essence(b), d.name
    assert any(app["name"] == "ordeal-spark-connect" for app in cluster.state()["completedapps"])


@pytest.fixture
def out_dir():
    path = Path(tempfile.mkdtemp(prefix="ordeal-run-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.nightly  # a cluster start and two JVMs (~2 min on an idle machine); CI keeps the unreachable master
def test_a_few_catalog_histories_agree_on_the_cluster_and_local(cluster, catalog_dirs, tmp_path):
    """The quick share of the two catalog tests above: three of its histories, on the cluster and on local[2], the
    executors' Python workers this venv's."""
    dirs = catalog_dirs[:3]
    local = _check_in_child(dirs, tmp_path / "local.json", "local[2]")["reports"]
    out = _check_in_child(dirs, tmp_path / "cluster.json", cluster.master_url, cluster.env)
    assert out["reports"][0]["environment"]["spark_master"] == cluster.master_url
    assert out["pythons"] == [sys.executable]
    for d, a, b in zip(dirs, local, out["reports"], strict=True):
        assert _essence(a) == _essence(b), d.name


@pytest.mark.nightly  # a run and two checks of it (~3 min on an idle machine)
def test_a_real_run_checked_on_the_cluster_agrees_with_local(cluster, out_dir: Path, tmp_path: Path):
    """`ordeal check --spark-master spark://...` with the run directory as a path relative to the command's
    directory (made absolute before Spark sees it: the executors resolve nothing against their own), and
    local[2] with a file:// URI."""
    source = find_scenario("p2p-smoke").read_text()
    scenario = tmp_path / "p2p-smoke-lossy.toml"
    defect = '[broker]\ndefects = ["dup_on_first_delivery"]'
    scenario.write_text(source.replace("[broker]", defect, 1) if "[broker]" in source else f"{source}\n{defect}\n")
    result = run_scenario(scenario, 1, out_dir, check=False)
    assert result.summary["history_complete"], result.summary
    run_dir = result.run_dir.resolve()
    reports = {}
    for engine, where, args, env in (
            ("cluster", run_dir.name, ["--spark-master", cluster.master_url], cluster.env),
            ("local", run_dir.as_uri(), ["--spark-master", "local[2]"], None)):
        done = _run(["check", where, *args], env, cwd=run_dir.parent)
        assert done.returncode in (0, 1), done.stdout[-2000:] + done.stderr[-2000:]
        reports[engine] = json.loads((run_dir / "report.json").read_text())
    assert reports["cluster"]["environment"]["spark_master"] == cluster.master_url
    assert reports["local"]["environment"]["spark_master"] == "local[2]"
    assert _essence(reports["cluster"]) == _essence(reports["local"])
    assert reports["cluster"]["verdict"] == "fail"  # the planted defect was found, the same way by both


def test_an_unreachable_master_is_unknown_naming_it(catalog_dirs):
    master = f"spark://127.0.0.1:{closed_port()}"
    run_dir = catalog_dirs[0]
    done = _run(["check", str(run_dir), "--spark-master", master], timeout=120)
    assert done.returncode == EXIT_UNKNOWN, done.stdout + done.stderr
    report = json.loads((run_dir / "report.json").read_text())
    assert report["verdict"] == "unknown"
    reasons = {i["reason"] for i in report["invariants"] if i["verdict"] == "unknown"}
    assert reasons and all(master in r and "unreachable" in r for r in reasons), reasons


@pytest.mark.nightly  # it needs the cluster the tests above ran on
def test_the_cluster_leaves_no_process_behind(cluster, cluster_stack):
    """Last in the module: ends the cluster here.  Every PID it started or saw below them (the executors of the
    applications above included) is gone."""
    seen_executors = cluster.seen - {p.pid for p in cluster.processes}
    assert len(cluster.processes) == 3
    assert seen_executors, "no executor was ever seen: the checks above did not run on the cluster"
    cluster_stack[0].close()
    assert cluster.leftovers() == []
    assert all(p.poll() is not None for p in cluster.processes)
