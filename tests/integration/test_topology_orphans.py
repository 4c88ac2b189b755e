"""No orphans, ever: SIGKILL of the process that started the topology leaves no process and no namespace."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from harness import reaper
from harness.local.host_topology import LocalTopology
from harness.node import ProcessNode
from harness.topology_config import TopologyConfig

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def _start_up(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen, dict]:
    """Run `ordeal up` (waiting mode) and return it with the endpoints JSON it printed."""
    process = subprocess.Popen([sys.executable, "-m", "ordeal.cli", "up", "--run-dir", str(tmp_path / "run"),
                                *extra], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    lines = []
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            line = process.stdout.readline()
            if not line:
                raise AssertionError(f"ordeal up exited early: {process.wait()} {process.stderr.read()}")
            lines.append(line)
            if line.rstrip() == "}":  # the end of the pretty-printed JSON document
                return process, json.loads("".join(lines))
        raise AssertionError("ordeal up did not print its endpoints in 60 s")
    except BaseException:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise


def _alive(identities: list[tuple[int, float]]) -> list[int]:
    alive = []
    for pid, created in identities:
        try:
            process = psutil.Process(pid)
            if process.create_time() == created and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def _netns_holders(inode: str) -> list[int]:
    holders = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "ns" / "net") == inode:
                    holders.append(int(entry.name))
            except OSError:
                pass
    return holders


def _wait_until_gone(identities: list[tuple[int, float]], timeout: float = 10) -> list[int]:
    deadline = time.monotonic() + timeout
    while _alive(identities) and time.monotonic() < deadline:
        time.sleep(0.1)
    return _alive(identities)


def _identities(pids) -> list[tuple[int, float]]:
    return [(pid, psutil.Process(pid).create_time()) for pid in pids]


def _end(process: subprocess.Popen) -> None:
    """A failed assertion must not leave `ordeal up` (its own session) and its nodes running."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def test_sigkill_of_ordeal_up_leaves_no_process(tmp_path: Path) -> None:
    process, endpoints = _start_up(tmp_path)
    try:
        printed = [node["pid"] for node in endpoints["nodes"]]
        assert len(printed) == 10 and all(printed)  # 6 Redis + Tansu + its S3 server + 2 broker nodes
        descendants = [p.pid for p in psutil.Process(process.pid).children(recursive=True)]
        assert set(printed) <= set(descendants)
        identities = _identities(descendants)
    except BaseException:
        _end(process)
        raise
    process.send_signal(signal.SIGKILL)
    process.wait()
    left = _wait_until_gone(identities)
    assert left == [], f"processes left after SIGKILL of ordeal up: {left}"


@pytest.mark.root(reason="--isolated needs root")
def test_sigkill_of_ordeal_up_isolated_leaves_no_process_and_no_namespace(tmp_path: Path) -> None:
    process, endpoints = _start_up(tmp_path, "--isolated")
    try:
        assert endpoints["network_namespace"] == "private" and endpoints["address_mode"] == "distinct"
        assert len({node["host"] for node in endpoints["nodes"]}) == len(endpoints["nodes"])
        # printed PIDs are inside the run's PID namespace; from here, find the same processes as descendants
        descendants = psutil.Process(process.pid).children(recursive=True)
        assert len(descendants) >= 1 + len(endpoints["nodes"])  # unshare's child (ordeal) + every node
        namespace = os.readlink(f"/proc/{descendants[-1].pid}/ns/net")
        assert namespace != os.readlink("/proc/self/ns/net")
        identities = _identities(p.pid for p in descendants)
    except BaseException:
        _end(process)
        raise
    process.send_signal(signal.SIGKILL)
    process.wait()
    left = _wait_until_gone(identities)
    assert left == [], f"processes left after SIGKILL of ordeal up --isolated: {left}"
    assert _netns_holders(namespace) == [], "the run's network namespace is still held"


def test_bad_scenario_topology_is_refused_naming_the_key(tmp_path: Path) -> None:
    scenario = tmp_path / "bad.toml"
    text = (REPO / "scenarios" / "p2p-smoke.toml").read_text()
    scenario.write_text(text.replace("redis_masters = 3", "redis_masters = 2"))
    result = subprocess.run([sys.executable, "-m", "ordeal.cli", "up", "--check", "--scenario", str(scenario),
                             "--run-dir", str(tmp_path / "run")], cwd=REPO, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode != 0
    assert "redis_masters" in result.stderr and "must be >= 3" in result.stderr, result.stderr


def test_missing_binary_starts_nothing(tmp_path: Path) -> None:
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    topology = LocalTopology(TopologyConfig(redis_server="/nonexistent/redis-server"), tmp_path)
    with pytest.raises(RuntimeError, match="redis_server = '/nonexistent/redis-server'"):
        topology.start()
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before
    assert topology.nodes() == []


def test_failure_late_in_start_up_stops_everything_already_running(tmp_path: Path) -> None:
    """Redis and Kafka are up when the broker step fails: start() must stop all of them."""
    seen: list[ProcessNode] = []

    def failing_broker_config(topology: LocalTopology) -> Path:
        seen.extend(topology.nodes())
        assert all(node.is_alive() for node in seen)
        raise RuntimeError("broker configuration could not be written")

    topology = LocalTopology(TopologyConfig(broker_nodes=1), tmp_path, broker_config=failing_broker_config)
    with pytest.raises(RuntimeError, match="broker configuration"):
        topology.start()
    assert len(seen) == 8
    assert [node.name for node in seen if node.is_alive()] == []
    assert not set(reaper.tracked()) & {node._process.pid for node in seen}


def test_node_that_dies_at_start_reports_its_log(tmp_path: Path) -> None:
    node = ProcessNode("doomed", "test", "127.0.0.1", 1, [sys.executable, "-c", "print('bad flag'); exit(3)"],
                       log_path=tmp_path / "doomed.log", data_dir=tmp_path / "doomed")
    node.start()
    pid = node._process.pid
    with pytest.raises(RuntimeError, match=r"(?s)doomed is not running \(exit code 3\).*bad flag"):
        node.wait_ready(5)
    assert pid not in reaper.tracked()  # found dead: its number is never signalled again
    node.stop()
    node.start()  # and it can be started again
    assert node.pid != pid
    node.kill()


def test_restart_from_a_short_lived_thread_survives_that_thread(tmp_path: Path) -> None:
    """PDEATHSIG is per forking thread: a node (re)started from a worker thread must outlive the worker."""
    import threading

    node = ProcessNode("sleeper", "test", "127.0.0.1", 1, ["sleep", "30"], log_path=tmp_path / "s.log",
                       data_dir=tmp_path / "s", ready_check=lambda n: True)
    worker = threading.Thread(target=node.start)
    worker.start()
    worker.join()
    try:
        time.sleep(0.3)
        assert node.is_alive()
        node.pause()
        assert psutil.Process(node.pid).status() == psutil.STATUS_STOPPED
        node.resume()
        assert psutil.Process(node.pid).status() != psutil.STATUS_STOPPED
    finally:
        node.kill()
    assert not node.is_alive() and node.pid is None


@pytest.mark.root(reason="simulates a non-root user from root with a user namespace")
def test_isolated_is_refused_clearly_for_a_non_root_user(tmp_path: Path) -> None:
    # inside a fresh user namespace without a uid map this process is uid 65534, with no privileges
    result = subprocess.run(["unshare", "--user", "--", sys.executable, "-m", "ordeal.cli", "up", "--isolated",
                             "--check", "--run-dir", str(tmp_path / "run")], cwd=REPO, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 3  # a usage error (ordeal/cli.py EXIT_USAGE)
    assert "network isolation needs root" in result.stderr and "uid 65534" in result.stderr
    assert "without --isolated" in result.stderr
    assert not (tmp_path / "run").exists()  # refused before anything was created or started


def test_graceful_stop_of_a_paused_node_does_not_wait_for_the_timeout(tmp_path: Path) -> None:
    node = ProcessNode("paused", "test", "127.0.0.1", 1, ["sleep", "30"], log_path=tmp_path / "p.log",
                       data_dir=tmp_path / "p", ready_check=lambda n: True)
    node.start()
    pid = node.pid
    node.pause()
    began = time.monotonic()
    node.stop(timeout=10)  # SIGTERM alone would sit in a stopped process; stop() also sends SIGCONT
    assert time.monotonic() - began < 5
    assert not node.is_alive()
    assert not psutil.pid_exists(pid)  # reaped by stop(), not left as a zombie
    assert pid not in reaper.tracked()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_tears_ordeal_up_down_gracefully(tmp_path: Path, sig: signal.Signals) -> None:
    process, endpoints = _start_up(tmp_path)
    identities = _identities(node["pid"] for node in endpoints["nodes"])
    process.send_signal(sig)
    assert process.wait(30) == 0
    assert "stopping" in process.stderr.read()
    assert _alive(identities) == []  # stopped by teardown, not by the kernel
    redis_log = Path(endpoints["nodes"][0]["log"]).read_text()
    assert "ready to exit" in redis_log.lower() or "bye" in redis_log.lower()  # Redis shut down on SIGTERM
