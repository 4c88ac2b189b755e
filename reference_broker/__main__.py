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


class ErrorDetail(logging.Filter):
    """A Redis error's repr is only its kind and class (redis-py: ``server:ResponseError``), so a script's
    error (``... on @user_script:12.``) or a refused command never reached the log, where the log oracle
    reads it (Ordeal's docs/invariants.md "Node logs").  An exception among a record's arguments whose repr
    lacks its message is shown as ``repr: message``."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and any(isinstance(a, BaseException) for a in record.args):
            record.args = tuple(_Detailed(a) if isinstance(a, BaseException) else a for a in record.args)
        return True


class _Detailed:
    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __repr__(self) -> str:
        text, detail = repr(self.error), str(self.error)
        return text if not detail or detail in text else f"{text}: {detail}"

    def __str__(self) -> str:
        return str(self.error)


def run_node(node: NodeConfig, node_id: str, host: str, port: int) -> None:
    from reference_broker.server import Broker

    sys.stdout.reconfigure(line_buffering=True)  # the log must show "ready" (and a crash) at once
    logging.basicConfig(level=logging.INFO, stream=sys.stdout,
                        format=f"%(asctime)s {node_id} %(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(ErrorDetail())
    logging.getLogger("aiokafka").setLevel(logging.WARNING)
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
