"""A real Spark standalone cluster on 127.0.0.1 for tests: the installed pyspark's own master and workers, each a
JVM of its own (``spark-class org.apache.spark.deploy.master.Master`` / ``...deploy.worker.Worker``) in its own
process group.

``standalone_cluster(work_dir)`` starts the master and two workers (1 core, 1 GiB each by default), waits until the master's
JSON (``http://127.0.0.1:WEBUI/json``) shows both ALIVE, and on leaving ends every process it started and their
children (the executors) by PID and process group, then verifies that none is left.

The clients of the cluster (``ordeal check --spark-master``, a Spark Connect server on it) get ``Cluster.env``:
``SPARK_CONF_DIR`` naming a ``spark-defaults.conf`` that keeps executors small and runs their Python workers with
this venv's interpreter, ``PYSPARK_PYTHON`` the same, and ``SPARK_LOCAL_IP`` so the driver is on loopback too."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pyspark

SPARK_HOME = Path(pyspark.__file__).parent
SPARK_CLASS = SPARK_HOME / "bin" / "spark-class"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
EXECUTOR_MEMORY = "512m"
WORKER_MEMORY = "1g"
READY_TIMEOUT_S = 120


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def closed_port() -> int:
    """A loopback port nothing listens on (bound and released: free at the moment of return)."""
    return free_port()


@dataclass
class Cluster:
    master_url: str  # spark://127.0.0.1:P
    webui_url: str  # http://127.0.0.1:Q
    env: dict[str, str]  # for the cluster's clients (see the module doc)
    work_dir: Path
    processes: list[subprocess.Popen] = field(default_factory=list)
    seen: set[int] = field(default_factory=set)  # every PID started here or seen below one: checked at the end

    def state(self) -> dict:
        with urllib.request.urlopen(f"{self.webui_url}/json", timeout=5) as answer:  # noqa: S310 - loopback
            return json.loads(answer.read())

    def alive_workers(self) -> int:
        return sum(1 for w in self.state().get("workers", []) if w.get("state") == "ALIVE")

    def tree(self) -> set[int]:
        """The PIDs of the started processes and of their descendants now (executors are the workers')."""
        pids: set[int] = set()
        for started in self.processes:
            try:
                root = psutil.Process(started.pid)
                pids.add(root.pid)
                pids.update(child.pid for child in root.children(recursive=True))
            except psutil.NoSuchProcess:
                pass
        self.seen.update(pids)
        return pids

    def leftovers(self) -> list[int]:
        """The PIDs ever seen under this cluster that still run (zombies count as gone)."""
        return sorted(pid for pid in self.seen if _running(pid))


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _conf(work_dir: Path, executor_memory: str) -> Path:
    conf = work_dir / "conf"
    conf.mkdir(parents=True, exist_ok=True)
    (conf / "spark-defaults.conf").write_text("\n".join([
        f"spark.executor.memory {executor_memory}",
        "spark.executor.cores 1",
        "spark.cores.max 2",
        f"spark.pyspark.python {sys.executable}",
        f"spark.executorEnv.PYSPARK_PYTHON {sys.executable}",
        "spark.ui.enabled false",
        "",
    ]))
    return conf


@contextmanager
def standalone_cluster(work_dir: Path, workers: int = 2, executor_memory: str = EXECUTOR_MEMORY,
                       worker_memory: str = WORKER_MEMORY) -> Iterator[Cluster]:
    """``executor_memory`` / ``worker_memory``: each executor's heap and what each worker offers (Spark's size
    strings); the defaults keep a test's cluster small, a soak's history needs more (benchmarks/soak.py)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    conf = _conf(work_dir, executor_memory)
    port, webui = free_port(), free_port()
    base_env = {k: v for k, v in os.environ.items() if k not in ("SPARK_HOME", "SPARK_CONF_DIR")}
    daemon_env = {**base_env, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_CONF_DIR": str(conf),
                  "SPARK_DAEMON_MEMORY": "256m", "SPARK_LOG_DIR": str(work_dir / "logs"),
                  "PYSPARK_PYTHON": sys.executable}
    client_env = {"SPARK_LOCAL_IP": "127.0.0.1", "SPARK_CONF_DIR": str(conf), "PYSPARK_PYTHON": sys.executable}
    cluster = Cluster(f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{webui}", client_env, work_dir)

    def launch(name: str, argv: list[str]) -> None:
        with open(work_dir / f"{name}.log", "ab") as log:
            cluster.processes.append(subprocess.Popen(
                [str(SPARK_CLASS), *argv], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=daemon_env, cwd=work_dir, process_group=0))

    try:
        launch("master", [MASTER_CLASS, "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(webui)])
        _wait(cluster, lambda: cluster.state() is not None, "the master's web UI")
        for i in range(workers):
            worker_dir = work_dir / f"worker-{i}"
            worker_dir.mkdir(exist_ok=True)
            launch(f"worker-{i}", [WORKER_CLASS, cluster.master_url, "--cores", "1", "--memory", worker_memory,
                                   "--host", "127.0.0.1", "--webui-port", str(free_port()),
                                   "--work-dir", str(worker_dir)])
        _wait(cluster, lambda: cluster.alive_workers() == workers, f"{workers} ALIVE workers")
        cluster.tree()
        ending = threading.Event()
        watcher = threading.Thread(target=_watch, args=(cluster, ending), daemon=True, name="spark-standalone-pids")
        watcher.start()
        try:
            yield cluster
        finally:
            ending.set()
            watcher.join()
    finally:
        _end(cluster)


def _watch(cluster: Cluster, ending: threading.Event) -> None:
    """Record the executors' PIDs as they come and go (each application's live only while it runs)."""
    while not ending.wait(0.5):
        cluster.tree()


def _wait(cluster: Cluster, ready, what: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        dead = [p for p in cluster.processes if p.poll() is not None]
        if dead:
            raise RuntimeError(f"Spark standalone: {dead[0].args[1]} exited {dead[0].returncode} before "
                               f"{what}; see the logs in {cluster.work_dir}")
        try:
            if ready():
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"Spark standalone: no {what} within {READY_TIMEOUT_S} s; see {cluster.work_dir}")
        time.sleep(0.2)


def _end(cluster: Cluster) -> None:
    """Workers first (each ends its executors), then the master; SIGTERM, then SIGKILL after 15 s; every PID ever
    seen must be gone, or RuntimeError names them."""
    cluster.tree()
    for started in reversed(cluster.processes):
        if started.poll() is None:
            try:
                os.killpg(started.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 15
    while cluster.leftovers() and time.monotonic() < deadline:
        for started in cluster.processes:
            started.poll()  # reap
        time.sleep(0.2)
    for started in cluster.processes:
        if started.poll() is None:
            try:
                os.killpg(started.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for pid in cluster.leftovers():  # a child that left its group
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for started in cluster.processes:
        try:
            started.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    deadline = time.monotonic() + 10
    while cluster.leftovers() and time.monotonic() < deadline:
        time.sleep(0.1)
    left = cluster.leftovers()
    if left:
        raise RuntimeError(f"Spark standalone: processes left after the cluster ended: {left}")
