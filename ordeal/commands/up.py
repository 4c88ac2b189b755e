"""``ordeal up``: start the local topology, print its endpoints as JSON, wait for Ctrl-C, tear down.

--check     verify health instead of waiting (Redis Cluster ready and agreeing, Kafka produce/consume
            round trip with a committed offset), print a JSON summary with timings, exit 0 healthy / 1 not.
--isolated  run inside private network + PID namespaces (root only): the process re-executes itself
            under ``unshare --net --pid --fork --kill-child --mount-proc``, each node gets its own
            127.0.0.x, and a SIGKILL of this process takes every node and the namespace with it.
            PIDs printed in that mode are PIDs inside the run's PID namespace.
Without --isolated the nodes listen on 127.0.0.1 (free ports) so you can poke them with your own tools."""

from __future__ import annotations

import importlib.util
import json
import signal
import sys
import time
import tomllib
from datetime import UTC, datetime
from pathlib import Path

import click

from harness import netns
from harness.binaries import MissingBinaryError
from harness.node import NodeError
from harness.topology import LocalTopology
from harness.topology_config import TopologyConfig, TopologyConfigError


class _Shutdown(Exception):
    """SIGTERM / SIGHUP / Ctrl-C: leave the wait and tear down."""


def _on_signal(signum: int, frame: object) -> None:
    raise _Shutdown(signal.Signals(signum).name)


def _topology_config(scenario: Path | None) -> tuple[TopologyConfig, dict]:
    """The [topology] table (validated) and the [broker] table (the reference brokers' settings)."""
    if scenario is None:
        return TopologyConfig(), {}
    try:
        from ordeal.scenario import load_scenario
    except ImportError:
        load_scenario = None
    if load_scenario is not None:
        try:
            loaded = load_scenario(scenario)
        except ValueError as error:
            raise click.ClickException(str(error)) from error
        mapping, broker = dict(loaded.topology), dict(loaded.broker)
    else:
        try:
            document = tomllib.loads(scenario.read_text())
        except tomllib.TOMLDecodeError as error:
            raise click.ClickException(f"{scenario}: not valid TOML: {error}") from error
        mapping, broker = document.get("topology") or {}, document.get("broker") or {}
    try:
        config = TopologyConfig.from_mapping(mapping, source=f"{scenario} [topology]")
    except TopologyConfigError as error:
        raise click.ClickException(str(error)) from error
    if config.broker_nodes and importlib.util.find_spec("reference_broker.__main__") is None:
        raise click.ClickException(
            f"{scenario} [topology]: broker_nodes = {config.broker_nodes}, but the reference broker "
            "(python -m reference_broker) is not available in this installation")
    return config, broker


def _emit(document: dict) -> None:
    click.echo(json.dumps(document, indent=2))
    sys.stdout.flush()


@click.command("up")
@click.option("--scenario", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Take the topology sizes from this scenario's [topology] table.")
@click.option("--check", is_flag=True, help="Verify health, print a JSON summary, tear down, exit 0/1.")
@click.option("--isolated", is_flag=True, help="Private network + PID namespaces (root only).")
@click.option("--run-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where data/ and logs/ go (default: runs/up-<utc timestamp>).")
def up(scenario: Path | None, check: bool, isolated: bool, run_dir: Path | None) -> None:
    """Start the local topology and print its endpoints as JSON."""
    began = time.monotonic()
    if isolated and not netns.finish_reexec():
        try:
            netns.reexec_isolated([sys.executable, "-m", "ordeal.cli", *sys.argv[1:]])
        except netns.IsolationUnavailable as error:
            raise click.ClickException(str(error)) from error
    config, broker = _topology_config(scenario)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    run_dir = run_dir or Path("runs") / f"up-{stamp}"
    run_dir.mkdir(parents=True, exist_ok=True)
    topology = LocalTopology(config, run_dir, address_mode="distinct" if isolated else "loopback",
                             broker_config=broker)
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, _on_signal)
    exit_code = 0
    try:
        try:
            topology.start()
        except (NodeError, MissingBinaryError, OSError) as error:
            if not check:
                raise click.ClickException(str(error)) from error
            _emit({"healthy": False, "error": f"{type(error).__name__}: {error}", "run_dir": str(run_dir)})
            sys.exit(1)
        if check:
            from harness.health import check as check_health

            summary = check_health(topology)
            summary["timings"]["total_s"] = round(time.monotonic() - began, 3)
            _emit({**summary, "endpoints": topology.endpoints(), "pid_namespace": "private" if isolated else "host"})
            exit_code = 0 if summary["healthy"] else 1
        else:
            _emit({**topology.endpoints(), "pid_namespace": "private" if isolated else "host"})
            click.echo("ready; Ctrl-C to stop", err=True)
            while True:
                time.sleep(3600)
    except (_Shutdown, KeyboardInterrupt):
        click.echo("stopping", err=True)
    finally:
        topology.stop()
    sys.exit(exit_code)
