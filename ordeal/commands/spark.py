"""`ordeal spark status|start|stop` (the shared local Spark Connect server) and the Spark options every
checking command shares (``spark_options``).  The choice itself lives in spark_checkers/engine/spark_session.py."""

from __future__ import annotations

import functools
import json
import os
import sys
import time

import click

from contracts.errors import UsageError
from contracts.exit_codes import EXIT_UNKNOWN
from spark_checkers.defaults import WARM_UP_BIG_EVENTS, WARM_UP_MIN_EVENTS


def spark_options(command):
    """``--spark-master`` and ``--spark-remote`` for a command that checks runs.  ``--spark-remote`` is passed
    on through $ORDEAL_SPARK_REMOTE (so every stage below, and an isolated re-exec, sees it); the command
    function receives ``spark_master`` only.  When the command will use the shared local server, its start
    begins here, in the background, so the JVM starts while the command does its own work."""

    @click.option("--spark-remote", default=None, metavar="sc://HOST:PORT",
                  help="Check on this Spark Connect endpoint (default: $ORDEAL_SPARK_REMOTE, else the shared local "
                       "server Ordeal starts on demand; `ordeal spark status`).")
    @click.option("--spark-master", default=None, metavar="URL",
                  help="Check in a classic in-process Spark session with this master (local[2], spark://host:7077) "
                       "instead of Spark Connect (default: $ORDEAL_SPARK_MASTER).")
    @functools.wraps(command)
    def wrapper(*args, spark_master: str | None, spark_remote: str | None, **kwargs):
        from spark_checkers.engine.settings import event_log_conf
        from spark_checkers.engine.spark_session import choose, prepare

        if spark_master and spark_remote:
            raise UsageError("--spark-master and --spark-remote exclude each other: pick one Spark")
        if spark_remote:
            os.environ["ORDEAL_SPARK_REMOTE"] = spark_remote
        from spark_checkers.engine import connect_server

        try:
            choose(spark_master, None)  # validates the URL from either source
            connect_server.idle_timeout_s()  # and $ORDEAL_SPARK_IDLE_TIMEOUT, at start-up
            event_log_conf()  # and $ORDEAL_SPARK_EVENT_LOG
            connect_server.archive_dir()  # and $ORDEAL_SPARK_CLASS_ARCHIVE, $ORDEAL_JVM_CACHE_DIR
        except (ValueError, connect_server.ConnectServerError) as error:
            raise UsageError(str(error)) from None
        if kwargs.get("check", True) and not kwargs.get("rejudge") and not kwargs.get("promote_entry"):
            prepare(spark_master)
        return command(*args, spark_master=spark_master, **kwargs)

    return wrapper


@click.group(name="spark")
def spark() -> None:
    """The shared local Spark Connect server the checks run on (started on demand by every checking command,
    stopped after $ORDEAL_SPARK_IDLE_TIMEOUT seconds without a client, default 600)."""


@spark.command(name="status")
def status() -> None:
    """Print the server's state as JSON; exit 0 if it runs, 1 if not."""
    from spark_checkers.engine import connect_server

    state = connect_server.status()
    click.echo(json.dumps(state, indent=2))
    sys.exit(0 if state["running"] else 1)


@spark.command(name="start")
@click.option("--idle-timeout", type=click.FloatRange(min=1), default=None,
              help="Seconds without a client before it stops itself (default $ORDEAL_SPARK_IDLE_TIMEOUT or 600).")
@click.option("--master", default=None, help="The server's own master (default local[2]).")
@click.option("--warm-up", "warm", is_flag=True,
              help="Then check two synthetic histories on it (a run's once, and a bulk one with the big plan, "
                   "repeated: 70-85 s on a new server), so the first real check of either size finds its code "
                   "compiled and hot. Once per server; for a nightly or a machine about to check big histories, not "
                   "before a timed run.")
@click.option("--warm-up-events", "warm_events", type=click.IntRange(min=WARM_UP_MIN_EVENTS), default=None,
              help=f"The bulk history's size for --warm-up (default {WARM_UP_BIG_EVENTS:,}): smaller warms up "
                   "sooner and leaves more of the JIT's work to the first big check.")
def start(idle_timeout: float | None, master: str | None, warm: bool, warm_events: int | None) -> None:
    """Start the server (if none runs) and wait until it accepts clients; print its endpoint."""
    from spark_checkers.engine import connect_server

    if warm_events is not None and not warm:
        raise click.UsageError("--warm-up-events is the size of --warm-up's bulk history: give --warm-up too")
    from spark_checkers.engine.settings import event_log_conf

    try:
        event_log_conf()  # $ORDEAL_SPARK_EVENT_LOG, before anything starts
        connect_server.archive_dir()  # $ORDEAL_SPARK_CLASS_ARCHIVE, $ORDEAL_JVM_CACHE_DIR
    except (ValueError, connect_server.ConnectServerError) as error:
        raise click.UsageError(str(error)) from None
    if idle_timeout is not None:
        os.environ["ORDEAL_SPARK_IDLE_TIMEOUT"] = str(idle_timeout)
    try:
        state = connect_server.ensure_started(master=master)
        click.echo(f"Spark Connect server ready: sc://127.0.0.1:{state['port']} (pid {state['watchdog_pid']}, "
                   f"idle timeout {state['idle_timeout_s']:.0f} s, log {state['log']})")
        if warm:
            _warm_up(connect_server, state, warm_events or WARM_UP_BIG_EVENTS)
    except connect_server.ConnectServerError as error:
        click.echo(f"Error: {error}", err=True)
        sys.exit(EXIT_UNKNOWN)
    finally:
        connect_server.release_lease()  # this command does not use it: the idle clock starts now


def _warm_up(connect_server, state: dict, big_events: int) -> None:
    """``--warm-up``: the checks of ``api.warm_up`` on this server, once per server start.  A warm-up that does
    not find exactly what its histories plant is a Spark whose verdicts cannot be trusted: exit 2."""
    from dataclasses import asdict

    from spark_checkers.api import warm_up
    from spark_checkers.engine import spark_session as session

    p = connect_server.paths()
    done = connect_server.warmed_up(p, state)
    if done is not None:
        click.echo(f"already warmed up ({len(done['checks'])} checks, "
                   f"{time.strftime('%H:%M:%S', time.localtime(done['finished_unix']))})")
        return
    try:
        checks = warm_up(session.local_connect_session(), big_events=big_events)
    except session.SparkUnavailable as error:
        raise connect_server.ConnectServerError(str(error)) from error
    finally:
        session.close_sessions()
    for check in checks:
        click.echo(f"warm-up: {check.plan} plan, {check.events} events, {check.seconds:.1f} s, found {check.found}")
    wrong = [c for c in checks if not c.right]
    if wrong:
        for check in wrong:
            click.echo(f"Error: the warm-up's {check.plan}-plan check found {check.found}, its history plants "
                       f"{check.planted}: this Spark's verdicts cannot be trusted"
                       + (f" ({check.why_unknown})" if check.why_unknown else ""), err=True)
        sys.exit(EXIT_UNKNOWN)
    connect_server.record_warm_up(p, state, [asdict(c) for c in checks])


@spark.command(name="stop")
def stop() -> None:
    """Stop the server (exit 0 also when none was running)."""
    from spark_checkers.engine import connect_server

    try:
        stopped = connect_server.stop(notify=lambda why: click.echo(f"waiting: {why}", err=True))
    except connect_server.ConnectServerError as error:
        click.echo(f"Error: {error}", err=True)
        sys.exit(EXIT_UNKNOWN)
    click.echo("stopped" if stopped else "no Spark Connect server was running")
