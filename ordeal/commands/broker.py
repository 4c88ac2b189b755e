"""``ordeal broker`` (run one reference-broker node in the foreground) and ``ordeal defects`` (list the
defect catalog)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import click

from contracts.errors import UsageError
from reference_broker.config import BrokerConfig, ConfigError, NodeConfig, read_node_config_file
from reference_broker.defects import CATALOG


@click.command(name="broker")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Node config JSON: {broker: {...}, redis_startup_nodes: [...], kafka_bootstrap: ...}.")
@click.option("--scenario", "scenario_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Scenario TOML: its [broker] table configures the node; give --redis and --kafka too.")
@click.option("--redis", "redis_nodes", multiple=True, metavar="HOST:PORT",
              help="Redis Cluster startup node (repeatable); with --scenario, or to override --config.")
@click.option("--kafka", "kafka_bootstrap", metavar="HOST:PORT", help="Kafka bootstrap address.")
@click.option("--node-id", required=True, help="This node's id, e.g. broker-1 (unique among the nodes).")
@click.option("--listen", required=True, metavar="HOST:PORT", help="MQTT listen address.")
@click.option("--print-config", is_flag=True, help="Print the validated node config as JSON and exit.")
def broker(config_path: Path | None, scenario_path: Path | None, redis_nodes: tuple[str, ...],
           kafka_bootstrap: str | None, node_id: str, listen: str, print_config: bool) -> None:
    """Run one reference-broker node in the foreground (Ctrl-C stops it)."""
    from reference_broker.__main__ import parse_listen, run_node

    if (config_path is None) == (scenario_path is None):
        raise click.UsageError("give exactly one of --config FILE.json or --scenario FILE.toml")
    try:
        host, port = parse_listen(listen)
    except Exception as error:  # argparse.ArgumentTypeError
        raise click.BadParameter(str(error), param_hint="--listen") from None
    try:
        if config_path is not None:
            mapping = read_node_config_file(config_path)
            source = str(config_path)
        else:
            mapping = {"broker": _read_broker_table(scenario_path)}
            source = f"{scenario_path}"
        if redis_nodes:
            mapping["redis_startup_nodes"] = list(redis_nodes)
        if kafka_bootstrap:
            mapping["kafka_bootstrap"] = kafka_bootstrap
        if scenario_path is not None and (not redis_nodes or not kafka_bootstrap):
            raise ConfigError(f"{scenario_path}: a scenario holds no endpoints; give --redis HOST:PORT "
                              "(one or more) and --kafka HOST:PORT")
        node = NodeConfig.from_mapping(mapping, source=source)
    except ConfigError as error:  # the system under test shares no code with Ordeal: its own error class
        raise UsageError(str(error)) from None
    if print_config:
        click.echo(json.dumps(node.to_dict(), indent=2))
        return
    run_node(node, node_id, host, port)


def _read_broker_table(path: Path) -> dict:
    try:
        document = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such scenario file") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: not valid TOML: {error}") from None
    table = document.get("broker", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [broker] must be a table")
    BrokerConfig.from_mapping(table, source=f"{path} [broker]")  # validate early, with the file's name
    return table


@click.command(name="defects")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def defects(as_json: bool) -> None:
    """List the reference broker's defect catalog: name, what is wrong, the invariant that must catch it."""
    if as_json:
        click.echo(json.dumps([{"name": d.name, "what": d.what, "invariant": d.invariant,
                                "needs_fault": d.needs_fault, "where": d.where} for d in CATALOG.values()],
                              indent=2))
        return
    width = max(len(name) for name in CATALOG)
    for d in CATALOG.values():
        fault = " [needs a fault]" if d.needs_fault else ""
        click.echo(f"{d.name:<{width}}  {d.invariant:<34} {d.what}{fault}")
    click.echo(f"\n{len(CATALOG)} defects, all off by default; switch one on with "
               "[broker] defects = [\"name\"] in a scenario.")
