"""The Spark the checkers run on, chosen in one place (``spark_session``).

In order of precedence:
1. ``remote`` (``--spark-remote sc://HOST:PORT``): an existing Spark Connect endpoint (a cluster's, or a
   server of one's own).  An unreachable one raises ``SparkUnavailable`` naming it (the checks are then
   unknown, never passed).
2. ``master`` (``--spark-master URL``): a classic in-process session (py4j + a JVM of this process's own).
3. ``$ORDEAL_SPARK_REMOTE``, then ``$ORDEAL_SPARK_MASTER``: the same, from the environment.
4. A classic session already active in this process (tests, benchmarks) is reused as is.
5. Otherwise the shared local Spark Connect server (spark_checkers/connect_server.py), started on demand
   and reused by every later command until it has been idle for $ORDEAL_SPARK_IDLE_TIMEOUT seconds.

Both kinds of session get the same SQL settings (``SQL_CONF``); the checkers use only the DataFrame API that
classic and Connect share (no RDDs, no SparkContext).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

DEFAULT_MASTER = "local[2]"
CODEGEN_CACHE_ENTRIES = "4000"

# Session-level SQL settings: set on every session, classic or Connect (a remote cluster gets them too).
SQL_CONF = {
    "spark.sql.shuffle.partitions": os.environ.get("ORDEAL_SPARK_SHUFFLE_PARTITIONS", "8"),
    "spark.sql.adaptive.enabled": "true",
    # The delivery side is partitioned by (run, subscriber) once; joins and windows keyed by (run, subscriber,
    # ...) may then use that partitioning as it is, and a cached table keeps it (no re-shuffles).
    "spark.sql.requireAllClusterKeysForCoPartition": "false",
    "spark.sql.optimizer.canChangeCachedPlanOutputPartitioning": "false",
    "spark.sql.ansi.enabled": "false",  # out-of-range array lookups give null, not an error
    "spark.sql.session.timeZone": "UTC",
    # An aggregate with a digest (the latency percentiles per time bucket) keeps up to this many groups in its
    # hash map before it falls back to sorting every input row (default 128: a 10 M event check's ~200
    # buckets per task sorted 2.5 M rows, 7 % of its task CPU).
    "spark.sql.objectHashAggregate.sortBased.fallbackThreshold": "1024",
}


def static_conf() -> dict[str, str]:
    """Settings fixed when a local JVM starts (classic session or the local Connect server)."""
    return {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.memory": os.environ.get("ORDEAL_SPARK_DRIVER_MEMORY", "3g"),
        # Spark's cache of compiled generated classes (default 100 entries): one check compiles ~400 (its queries'
        # code stages), so with the default every check evicted the last one's and compiled (Janino) and
        # JIT-compiled everything anew.  Big enough for a few check shapes (small/big, one run/many) at once.
        "spark.sql.codegen.cache.maxEntries": CODEGEN_CACHE_ENTRIES,
        # PySpark wraps every DataFrame and column function to record its Python call site for error messages:
        # in a classic session five calls into the JVM each (the active session, the setting, the origin set and
        # cleared), for each of the ~1,600 functions that build a check's rules.  Off, a warm 10k check took
        # 4.0-4.2 s against 5.0-5.1 s (docs/report.md, session 14).  A checker's error still names its invariant
        # (api.py).  A static setting: a Connect client records the call site in Python alone, no calls.
        "spark.python.sql.dataFrameDebugging.enabled": "false",
        # A JVM's first big check queues thousands of methods for its one C2 compiler thread (two cores), and
        # until C2 gets to them they run as tier 3: C1 code that also records a full profile, the slowest
        # compiled code.  With the tier-3 delay at 2 queued methods (default 5), the JIT compiles new methods at
        # tier 2 (C1, counters only) while that queue is long, and profiles them once it is short.  Fresh JVMs
        # alternating, a 20k check then a 10 M one: 4 of 4 pairs faster, median ratio 0.94, JVM CPU 0.93;
        # small checks within the noise (docs/report.md, session 19).  More C2 threads instead
        # (CICompilerCount=4) helped the 10 M check as much but slowed a fresh JVM's small checks by a fifth;
        # higher tier-4 thresholds likewise (10 M first check 0.90x, 100k checks 1.13x: session 20).
        # $ORDEAL_SPARK_JAVA_OPTIONS adds JVM flags (the benchmark's A/B of JIT settings).
        "spark.driver.extraJavaOptions": " ".join(
            ["-XX:+UseParallelGC", "-XX:Tier3DelayOn=2", "-XX:Tier3DelayOff=1",
             *os.environ.get("ORDEAL_SPARK_JAVA_OPTIONS", "").split()]),
        **event_log_conf(),
    }


EVENT_LOG_ENV = "ORDEAL_SPARK_EVENT_LOG"


def event_log_conf() -> dict[str, str]:
    """With $ORDEAL_SPARK_EVENT_LOG naming a directory (made if missing), every JVM started while it is set (the
    local server, a classic session) writes Spark's event log there: one plain JSON-lines file per JVM, which
    ``benchmarks/stages.py`` reads to say where a check's task time went, job by job (and Spark's history server
    shows).  Unset: no event log.  A path that cannot be a directory is a ValueError naming the variable."""
    where = os.environ.get(EVENT_LOG_ENV, "")
    if not where:
        return {}
    path = Path(where).expanduser().resolve()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ValueError(f"${EVENT_LOG_ENV}={where!r}: expected a directory for Spark's event log "
                         f"({error.strerror or error})") from None
    return {"spark.eventLog.enabled": "true", "spark.eventLog.dir": path.as_uri(),
            "spark.eventLog.compress": "false", "spark.eventLog.rolling.enabled": "false"}


def server_conf() -> dict[str, str]:
    return {**static_conf(), **SQL_CONF}


class SparkUnavailable(RuntimeError):
    """No Spark to check with; the message names the endpoint or master and why."""


@dataclass(frozen=True)
class SparkChoice:
    kind: str  # "remote" | "classic" | "active" | "local-connect"
    target: str  # the sc:// URL, the master, or "" for the managed local server

    def describe(self) -> str:
        if self.kind == "local-connect":
            return "the local Spark Connect server"
        if self.kind == "remote":
            return f"Spark Connect endpoint {self.target}"
        return f"master {self.target}"


def validate_remote(url: str) -> str:
    """``sc://HOST:PORT[/;param=value...]`` or a ValueError naming what is wrong."""
    parsed = urlparse(url)
    if parsed.scheme != "sc" or not parsed.hostname:
        raise ValueError(f"Spark Connect endpoint {url!r}: expected sc://HOST:PORT (e.g. sc://127.0.0.1:15002)")
    try:
        parsed.port  # noqa: B018 - raises on a malformed port
    except ValueError as error:
        raise ValueError(f"Spark Connect endpoint {url!r}: {error}") from None
    return url


def choose(master: str | None = None, remote: str | None = None) -> SparkChoice:
    if remote:
        return SparkChoice("remote", validate_remote(remote))
    if master:
        return SparkChoice("classic", master)
    if os.environ.get("ORDEAL_SPARK_REMOTE"):
        return SparkChoice("remote", validate_remote(os.environ["ORDEAL_SPARK_REMOTE"]))
    if os.environ.get("ORDEAL_SPARK_MASTER"):
        return SparkChoice("classic", os.environ["ORDEAL_SPARK_MASTER"])
    if _active_classic() is not None:
        return SparkChoice("active", "")
    return SparkChoice("local-connect", "")


def spark_session(master: str | None = None, app_name: str = "ordeal-checkers", *, remote: str | None = None):
    """The session the checks run on (see the module doc for the choice).  Raises ``SparkUnavailable``."""
    choice = choose(master, remote)
    if choice.kind == "active":
        return _active_classic()
    if choice.kind == "classic":
        return _classic(choice.target, app_name)
    if choice.kind == "remote":
        _probe(choice.target)
        return _connect(choice.target, choice.target)
    return local_connect_session()


def local_connect_session():
    """A session on the shared local Spark Connect server, started if none runs."""
    from spark_checkers import connect_server

    try:
        state = connect_server.ensure_started()
        url = connect_server.local_endpoint(state)
    except (connect_server.ConnectServerError, OSError) as error:
        raise SparkUnavailable(f"{SparkChoice('local-connect', '').describe()}: {error}") from error
    # Keyed by the server's start too: a restarted server behind the same bridge port is a new session.
    return _connect(url, f"sc://127.0.0.1:{state['port']} (local, shared)", key=f"{url}@{state.get('started_unix')}")


def prepare(master: str | None = None, remote: str | None = None) -> None:
    """Start the shared local server in the background if this command will use it: its JVM start then
    overlaps the command's own work (a run's topology and workload).  Never raises: the check reports it."""
    try:
        if choose(master, remote).kind == "local-connect":
            from spark_checkers import connect_server

            connect_server.ensure_started(wait=False)
    except Exception:  # noqa: BLE001, S110 - the check itself will say what is wrong
        pass


_labels: dict[int, str] = {}
_connect_sessions: dict[str, object] = {}


def close_sessions() -> None:
    """Stop this process's Spark Connect sessions (before stopping their server: a client of a dead server
    retries for minutes when its process exits)."""
    for spark in list(_connect_sessions.values()):
        try:
            spark.stop()
        except Exception:  # noqa: BLE001, S110 - best effort at shutdown
            pass
    _connect_sessions.clear()


def describe(spark) -> str:
    """The master (classic) or the endpoint (Connect) a session runs on, for reports."""
    label = _labels.get(id(spark))
    if label:
        return label
    try:
        return spark.sparkContext.master
    except Exception:  # noqa: BLE001 - a Connect session has no SparkContext
        return "spark connect"


def is_connect(spark) -> bool:
    return type(spark).__module__.startswith("pyspark.sql.connect")


def _active_classic():
    try:
        from pyspark.sql import SparkSession

        return SparkSession.getActiveSession()
    except Exception:  # noqa: BLE001 - under Spark Connect-only installs there is no classic session
        return None


def _classic(master: str, app_name: str):
    from pyspark.sql import SparkSession

    active = _active_classic()
    if active is not None and active.sparkContext.master == master:
        return active
    if not _connect_sessions:
        # pyspark marks a process that made a Connect session with $SPARK_CONNECT_MODE_ENABLED, and its
        # children inherit the mark: a classic session in such a child (a command started by a process that
        # checked on Connect, e.g. the test session) would then refuse to start.  This process has no Connect
        # session of its own, so the mark is not its own.
        os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
    if master.startswith("local"):
        # A local check talks only to itself: keep the driver on loopback rather than the host's interface.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in server_conf().items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    _labels[id(spark)] = master
    return spark


def _probe(url: str, timeout: float = 5.0) -> None:
    parsed = urlparse(url)
    try:
        with socket.create_connection((parsed.hostname, parsed.port or 15002), timeout=timeout):
            pass
    except OSError as error:
        raise SparkUnavailable(f"Spark Connect endpoint {url} is unreachable: {error}") from None


def _connect(url: str, label: str, key: str | None = None):
    from pyspark.sql import SparkSession

    key = key or url
    # The client's gRPC threads may be busy (a background check in explore) while the harness forks its
    # processes; none of those children speaks gRPC, so gRPC's fork handlers (and their log line per fork)
    # are not needed.  Read when grpc is first imported.
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    known = _connect_sessions.get(key)
    if known is not None and not getattr(known, "is_stopped", False):
        return known
    try:
        spark = SparkSession.builder.remote(url).create()
        for name, value in SQL_CONF.items():
            spark.conf.set(name, value)
    except Exception as error:  # noqa: BLE001 - gRPC errors: name the endpoint
        raise SparkUnavailable(f"Spark Connect endpoint {label}: {type(error).__name__}: "
                               f"{str(error).strip().splitlines()[0] if str(error).strip() else ''}") from error
    _connect_sessions[key] = spark
    _labels[id(spark)] = label
    return spark
