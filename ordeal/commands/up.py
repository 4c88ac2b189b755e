"""``ordeal up``: start the local topology, print its endpoints as JSON, wait for Ctrl-C, tear down.

--brokers N reference-broker nodes to start (default: 2, or the scenario's [topology] broker_nodes with
            --scenario; 0 = only Redis and Kafka).  Their MQTT endpoints are printed under "mqtt".
--check     verify health instead of waiting (Redis Cluster ready and agreeing, Kafka produce/consume
            round trip with a committed offset, and with brokers an MQTT QoS 1 round trip: publisher on
            the first node, persistent subscriber on the last one), print a JSON summary with timings,
            exit 0 healthy / 1 not.
--isolated  run inside private network + PID namespaces (root only): the process re-executes itself
            under ``unshare --net --pid --fork --kill-child --mount-proc``, each node gets its own
            127.0.0.x, and a SIGKILL of this process takes every node and the namespace with it.
            PIDs printed in that mode are PIDs inside the run's PID namespace.
--provider containers   the same topology as containers on the run's own Podman (implies --isolated);
            poke them from the run's namespace: `nsenter -t PID -n redis-cli -h 10.123.0.11 cluster nodes`,
            PID being the `ordeal up` process you started (it becomes `unshare`, in the run's namespace).
Without --isolated the nodes listen on 127.0.0.1 (free ports) so you can poke them with your own tools."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import click

import harness.model  # noqa: F401  (registers the stages into the scenario model)
from contracts.errors import UsageError
from contracts.scenario import load_scenario
from harness import netns
from harness.binaries import MissingBinaryError
from harness.local.host_topology import LocalTopology
from harness.node import NodeError
from harness.topology_config import TopologyConfig
from ordeal.commands.images import build_missing_images

DEFAULT_BROKERS = 2  # `ordeal up` without --scenario: a two-node broker cluster


class _Shutdown(Exception):
    """SIGTERM / SIGHUP / Ctrl-C: leave the wait and tear down."""


def _on_signal(signum: int, frame: object) -> None:
    raise _Shutdown(signal.Signals(signum).name)


def _topology_config(scenario: Path | None, brokers: int | None) -> tuple[TopologyConfig, dict]:
    """The [topology] table (validated) and the [broker] table (the reference brokers' settings).
    ``brokers`` (--brokers) overrides broker_nodes; without it and without a scenario: DEFAULT_BROKERS.
    (TopologyConfig's own default stays 0: library users and the test fixtures start no brokers.)"""
    if scenario is None:
        config, broker, source = TopologyConfig(), {}, "ordeal up"
    else:
        config, broker = _scenario_config(scenario)
        source = f"{scenario} [topology]"
    count = brokers if brokers is not None else DEFAULT_BROKERS if scenario is None else config.broker_nodes
    config = dataclasses.replace(config, broker_nodes=count)
    if count and config.kafka_storage == "none":
        raise UsageError(
            f"{source}: kafka_storage = 'none' leaves the {count} broker node(s) without Kafka; "
            "use --brokers 0 or another kafka_storage")
    return config, broker


def _scenario_config(scenario: Path) -> tuple[TopologyConfig, dict]:
    """The scenario's [topology] table as a TopologyConfig and its [broker] table.  A scenario that does not
    load (ScenarioError) or a [topology] that is wrong (TopologyConfigError) is a usage error: exit 3."""
    loaded = load_scenario(scenario)
    return (TopologyConfig.from_mapping(dict(loaded.topology), source=str(scenario)),
            dict(loaded.broker))


def _check(topology: LocalTopology) -> dict:
    """harness/health.py's checks plus, with broker nodes, the MQTT round trip through them."""
    from harness.health import check as check_health

    summary = check_health(topology)
    if topology.brokers and summary.get("brokers", {}).get("ok"):
        from harness.round_trip import mqtt_round_trip

        first, last = topology.brokers[0], topology.brokers[-1]
        try:
            summary["mqtt"] = mqtt_round_trip((first.host, first.port), (last.host, last.port))
        except Exception as error:  # noqa: BLE001 - reported as unhealthy with the reason
            summary["mqtt"] = {"ok": False, "error": f"{type(error).__name__}: {error}"}
        summary["healthy"] = summary["healthy"] and summary["mqtt"]["ok"]
    return summary


def _emit(document: dict) -> None:
    click.echo(json.dumps(document, indent=2))
    sys.stdout.flush()


@click.command("up")
@click.option("--scenario", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Take the topology sizes from this scenario's [topology] table.")
@click.option("--brokers", type=click.IntRange(min=0), default=None,
              help=f"Reference-broker nodes to start (default {DEFAULT_BROKERS}; with --scenario its "
                   "[topology] broker_nodes; 0 = none).")
@click.option("--check", is_flag=True, help="Verify health, print a JSON summary, tear down, exit 0/1.")
@click.option("--isolated", is_flag=True, help="Private network + PID namespaces (root only).")
@click.option("--run-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where data/ and logs/ go (default: runs/up-<utc timestamp>).")
@click.option("--provider", type=click.Choice(["local", "containers"]), default=None,
              help="Topology provider (default: the scenario's, else local).  containers implies --isolated: "
                   "the containers' network lives in the run's namespace; poke it with `nsenter -t PID -n`.")
def up(scenario: Path | None, brokers: int | None, check: bool, isolated: bool, run_dir: Path | None,
       provider: str | None) -> None:
    """Start the local topology and print its endpoints as JSON."""
    began = time.monotonic()
    if provider == "containers":
        isolated = True
    if os.environ.get(netns.MARKER) not in ("reexec", "private"):  # not yet in the namespace: the host's network
        config, _ = _topology_config(scenario, brokers)
        if (provider or config.provider) == "containers":
            from harness.containers.autobuild import reference_images

            build_missing_images(names=reference_images(config))  # on first use, with progress on stderr
    if isolated and not netns.finish_reexec():
        try:
            netns.reexec_isolated([sys.executable, "-m", "ordeal.cli", *sys.argv[1:]])
        except netns.IsolationUnavailable as error:
            raise UsageError(str(error)) from error
    config, broker = _topology_config(scenario, brokers)
    if provider is not None:
        config = dataclasses.replace(config, provider=provider)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    run_dir = run_dir or Path("runs") / f"up-{stamp}"
    run_dir.mkdir(parents=True, exist_ok=True)
    if config.provider == "containers":
        from harness.containers.topology import ContainerTopology

        topology = ContainerTopology(config, run_dir, broker_config=broker)
    else:
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
                raise UsageError(str(error)) from error
            _emit({"healthy": False, "error": f"{type(error).__name__}: {error}", "run_dir": str(run_dir)})
            sys.exit(1)
        if check:
            summary = _check(topology)
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
