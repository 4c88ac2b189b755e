"""The Spark the checkers run on, chosen in one place (``spark_session``).

In order of precedence:
1. ``remote`` (``--spark-remote sc://HOST:PORT``): an existing Spark Connect endpoint (a cluster's, or a
   server of one's own).  An unreachable one raises ``SparkUnavailable`` naming it (the checks are then
   unknown, never passed).
2. ``master`` (``--spark-master URL``): a classic in-process session (py4j + a JVM of this process's own).
   A standalone master (``spark://``) nobody listens on raises ``SparkUnavailable`` naming it, within seconds.
3. ``$ORDEAL_SPARK_REMOTE``, then ``$ORDEAL_SPARK_MASTER``: the same, from the environment.
4. A classic session already active in this process (tests, benchmarks) is reused as is.
5. Otherwise the shared local Spark Connect server (connect_server.py beside this module), started on
   demand and reused by every later command until it has been idle for $ORDEAL_SPARK_IDLE_TIMEOUT seconds.

Both kinds of session get the same SQL settings (settings.py: ``SQL_CONF``); the checkers use only the DataFrame API that
classic and Connect share (no RDDs, no SparkContext).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from urllib.parse import urlparse

from spark_checkers.engine import connect_server
from spark_checkers.engine.settings import SQL_CONF, server_conf


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
    # Imported here: the CLI imports this module (``choose``, ``prepare``) without paying for pyspark.
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
    if master.startswith("spark://"):
        _probe_standalone(master)
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


def _probe_standalone(master: str, timeout: float = 5.0) -> None:
    """A standalone master (``spark://HOST:PORT[,HOST:PORT...]``, several for a standby pair) nobody listens on
    is unavailable at once: Spark itself retries the registration for about a minute before it gives up."""
    errors = []
    for address in master.removeprefix("spark://").split(","):
        host, _, port = address.rpartition(":")
        try:
            with socket.create_connection((host or address, int(port) if port.isdigit() else 7077), timeout=timeout):
                return
        except (OSError, ValueError) as error:
            errors.append(f"{address}: {error}")
    raise SparkUnavailable(f"master {master} is unreachable: {'; '.join(errors)}")


def _connect(url: str, label: str, key: str | None = None):
    from pyspark.sql import SparkSession  # here: see _classic

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
