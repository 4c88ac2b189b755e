"""``python -m reference_broker --config FILE.json --node-id broker-1 --listen HOST:PORT``"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from reference_broker.config import ConfigError, NodeConfig


def parse_listen(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"--listen {value!r}: expected HOST:PORT, e.g. 127.0.0.1:1883")
    return host, int(port)


def run_node(node: NodeConfig, node_id: str, host: str, port: int) -> None:
    from reference_broker.server import Broker

    sys.stdout.reconfigure(line_buffering=True)  # the log must show "ready" (and a crash) at once
    logging.basicConfig(level=logging.INFO, stream=sys.stdout,
                        format=f"%(asctime)s {node_id} %(levelname)s %(name)s: %(message)s")
    logging.getLogger("aiokafka").setLevel(logging.WARNING)
    if node.broker.event_loop == "uvloop":
        import uvloop

        uvloop.run(Broker(node, node_id, host, port).serve_forever())
    else:
        asyncio.run(Broker(node, node_id, host, port).serve_forever())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reference_broker", description=__doc__)
    parser.add_argument("--config", required=True, help="node config JSON (broker, redis_startup_nodes, kafka_bootstrap)")
    parser.add_argument("--node-id", required=True)
    parser.add_argument("--listen", required=True, type=parse_listen, help="HOST:PORT for MQTT")
    args = parser.parse_args(argv)
    try:
        node = NodeConfig.load(args.config)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    run_node(node, args.node_id, *args.listen)
    return 0


if __name__ == "__main__":
    sys.exit(main())
