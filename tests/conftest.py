"""Shared fixtures (documented in docs/topology.md).

At import time, before pytest or any test starts a thread, a root test session moves itself into its own
network namespace: every node then gets its own 127.0.0.x, no two test sessions on this machine (several
engineers, CI) can collide on a port, and network faults (nftables) stay inside the session."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.capabilities import CI, missing_capability  # noqa: E402

from harness import netns

if netns.is_root() and os.environ.get("ORDEAL_TEST_NETNS", "1") != "0":
    try:
        netns.enter_private_netns()
    except netns.IsolationUnavailable as error:
        if CI:  # a CI machine that cannot isolate must not report green by skipping the isolation tests
            raise RuntimeError(f"CI=true and the test session cannot be isolated: {error}") from error
        warnings.warn(f"test session not isolated: {error}", stacklevel=1)
if netns.in_private_netns():
    # Only `lo` exists here; Spark would otherwise bind the host name's address, which is not reachable.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

# The checks of this session's commands share one Spark Connect server of the session's own (not a user's),
# stopped at the end; the short idle timeout ends it also if this session is killed.
os.environ.setdefault("ORDEAL_SPARK_IDLE_TIMEOUT", "120")
_OWN_CACHE_DIR: str | None = None  # made here, removed by this session when it passes (kept for a look otherwise)
if "ORDEAL_CACHE_DIR" not in os.environ:
    import tempfile

    _OWN_CACHE_DIR = os.environ["ORDEAL_CACHE_DIR"] = tempfile.mkdtemp(prefix="ordeal-test-cache-")
# Every server of this session (tests with state directories of their own too) shares one JVM class archive, in
# the session's cache: written once by the first server that stops, never into a user's ~/.cache.
os.environ.setdefault("ORDEAL_JVM_CACHE_DIR", os.path.join(os.environ["ORDEAL_CACHE_DIR"], "jvm"))

import harness.model  # noqa: E402, F401  (registers the stages into the scenario model, as ordeal's commands do)
from harness.local.host_topology import LocalTopology  # noqa: E402  (after the namespace switch, on purpose)
from harness.topology_config import TopologyConfig  # noqa: E402


def pytest_runtest_setup(item: pytest.Item) -> None:
    """``@pytest.mark.root``: needs root (network namespaces, nftables); skips without it, fails under CI=true."""
    marker = item.get_closest_marker("root")
    if marker is not None and not netns.is_root():
        missing_capability(marker.kwargs.get("reason") or "needs root (network namespaces, nftables)")


@pytest.fixture(scope="session", autouse=True)
def _stop_shared_spark_server(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    from spark_checkers.engine import connect_server
    from spark_checkers.engine.spark_session import close_sessions

    close_sessions()
    connect_server.release_lease()
    connect_server.stop()
    # The server's log and state are worth a look only when something failed; a green session leaves nothing.
    if _OWN_CACHE_DIR is not None and request.session.testsfailed == 0:
        import shutil

        shutil.rmtree(_OWN_CACHE_DIR, ignore_errors=True)


@pytest.fixture(scope="session")
def topology(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTopology]:
    """The default local topology (3 Redis masters + 3 replicas, Tansu on S3, no broker nodes), started
    once per test session and stopped at its end.  Shared: a test that kills, pauses or otherwise
    disturbs a node must bring it back and wait for readiness (topology.redis.wait_ready()), or use
    ``topology_factory`` for a topology of its own."""
    started = LocalTopology(TopologyConfig(), tmp_path_factory.mktemp("topology"))
    started.start()
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def topology_factory(tmp_path: Path) -> Iterator[Callable[..., LocalTopology]]:
    """make(config=None, **LocalTopology keyword args) -> a started LocalTopology of the test's own,
    stopped when the test ends (also when it fails)."""
    made: list[LocalTopology] = []

    def make(config: TopologyConfig | None = None, **kwargs) -> LocalTopology:
        started = LocalTopology(config or TopologyConfig(), tmp_path / f"topology-{len(made)}", **kwargs)
        made.append(started)
        started.start()
        return started

    try:
        yield make
    finally:
        for started in reversed(made):
            started.stop()


# Where the suite's time goes, by file: the CI output keeps only its tail, and a file's tests share fixtures
# (a topology, a Spark server) whose start the per-test durations split unevenly; this sum is what moving a
# file to the nightly tier would save.
_FILE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = report.nodeid.split("::", 1)[0]
    _FILE_SECONDS[path] = _FILE_SECONDS.get(path, 0.0) + report.duration


@pytest.hookimpl(trylast=True)  # after the per-test durations: the tail the CI output keeps
def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # noqa: ARG001
    if len(_FILE_SECONDS) < 2:
        return
    slowest = sorted(_FILE_SECONDS.items(), key=lambda item: -item[1])[:40]
    terminalreporter.write_sep("=", f"slowest {len(slowest)} files (setup + call + teardown)")
    for path, seconds in slowest:
        terminalreporter.write_line(f"{seconds:8.1f}s {path}")
