"""The local Redis Cluster's nodes: redis-server / valkey-server processes, each with its own config, data
directory and log under the run directory (the cluster itself: harness/running_redis_cluster.py)."""

from __future__ import annotations

import os
from pathlib import Path

from harness.addresses import BUS_OFFSET
from harness.node import ProcessNode
from harness.running_redis_cluster import RedisCommands, answers_ping


class RedisNode(RedisCommands, ProcessNode):
    """A redis-server / valkey-server process of the local Redis Cluster, configured for cluster mode."""

    def __init__(self, name: str, host: str, port: int, binary: Path, *, run_dir: Path,
                 appendfsync: str, node_timeout_ms: int, env: dict[str, str] | None = None,
                 announce_port: int | None = None) -> None:
        data_dir = run_dir / "data" / name
        log_path = run_dir / "logs" / f"{name}.log"
        self.config_path = data_dir / "redis.conf"
        super().__init__(name, "redis", host, port, [str(binary), str(self.config_path)],
                         log_path=log_path, data_dir=data_dir, ready_check=answers_ping, env=env)
        self.appendfsync, self.node_timeout_ms = appendfsync, node_timeout_ms
        self.announce_port = announce_port  # the broker -> Redis link's proxy before this node (faults/latency.py)
        self._node_id: str | None = None

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # Written where the node will read it: on a size-limited data dir (harness/disk.py) that is the tmpfs
        # in the holder's mount namespace, not the host directory under it.
        config = self.data_view / self.config_path.name
        config.write_text(self._config_text())  # cluster state: nodes.conf + AOF
        if getattr(self, "lazyfs", None) is not None:  # harness/power.py: the harness' own file is not a write a
            with open(config, "rb+") as handle:       # power loss of the node may take (nor count as dropped)
                os.fsync(handle.fileno())
        super().start()

    def _config_text(self) -> str:
        return "\n".join([
            f"bind {self.host}",
            f"bind-source-addr {self.host}",  # required with distinct 127.0.0.x, or the bus links hang
            f"port {self.port}",
            "protected-mode no",
            "daemonize no",
            f"dir {self.data_dir}",
            "logfile \"\"",  # stdout, which the harness appends to the node's log
            "cluster-enabled yes",
            "cluster-config-file nodes.conf",
            f"cluster-node-timeout {self.node_timeout_ms}",
            "appendonly yes",
            f"appendfsync {self.appendfsync}",
            "save \"\"",
            "repl-diskless-sync-delay 0",  # default 5 s: a master killed before its replica synced stays down
            *self._announce_lines(),
            "",
        ])

    def _announce_lines(self) -> list[str]:
        """Clients (CLUSTER SLOTS / NODES, MOVED) are sent to the proxy's port; the bus stays direct: without
        its own announce line it would be announced as the proxy's port + 10000, where nothing listens."""
        if self.announce_port is None:
            return []
        return [f"cluster-announce-port {self.announce_port}", f"cluster-announce-bus-port {self.port + BUS_OFFSET}"]
