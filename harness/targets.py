"""Targets: the broker under test, as the executor sees it (MQTT endpoints) plus its life cycle.

- ``ReferenceTarget``: the local topology (Redis Cluster, Tansu, reference-broker nodes) from
  harness/topology.py; white box: ``snapshot()`` reads each session's Redis state after the drain.
- ``ExternalTarget``: any MQTT broker described by an address and start / stop / kill argv lists (e.g.
  Debian's Mosquitto).  Black box: no snapshot rows.

Both record a ``node_event`` row for every start / ready / stop / kill they perform.
"""

from __future__ import annotations

import json
import os
import pwd
import shlex
import shutil
import socket
import stat
import subprocess
from pathlib import Path
from typing import Any

from contracts.history_schema import Kind
from contracts.scenario import Scenario
from harness.history import HistoryRecorder
from properties.plan import Plan

Endpoint = tuple[str, int, str]


class TargetError(RuntimeError):
    """The target cannot be prepared or started; the message says what to change."""


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


class ExternalTarget:
    """A black-box MQTT broker started from argv.  Placeholders {run_dir} {data_dir} {log_dir} {host} {port}
    {pid} in argv and config_text are replaced; {pid} is the started process (for stop / kill argv)."""

    white_box = False

    def __init__(self, scenario: Scenario, run_dir: Path, recorder: HistoryRecorder):
        self.spec = scenario.target
        self.run_dir = Path(run_dir).resolve()
        self.recorder = recorder
        self.name = self.spec.name
        self.host = self.spec.host
        self.port = self.spec.port or free_port(self.host)
        self.data_dir = self.run_dir / "data" / self.name
        self.log_dir = self.run_dir / "logs"
        self.node = None

    def _values(self) -> dict[str, Any]:
        return {"run_dir": self.run_dir, "data_dir": self.data_dir, "log_dir": self.log_dir, "host": self.host,
                "port": self.port, "pid": self.node.pid if self.node is not None and self.node.pid else ""}

    def _format(self, text: str, where: str) -> str:
        try:
            return text.format(**self._values())
        except (KeyError, IndexError, ValueError) as error:
            raise TargetError(f"[target] {where}: cannot fill in placeholders in {text!r}: {error}; allowed: "
                              "{run_dir} {data_dir} {log_dir} {host} {port} {pid} (double braces for a literal)") from error

    def prepare(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if self.spec.config_file:
            (self.run_dir / self.spec.config_file).write_text(self._format(self.spec.config_text, "config_text"))
        if self.spec.data_owner and os.geteuid() == 0:
            try:
                owner = pwd.getpwnam(self.spec.data_owner)
            except KeyError:
                raise TargetError(f"[target] data_owner = {self.spec.data_owner!r}: no such user on this machine") from None
            os.chown(self.data_dir, owner.pw_uid, owner.pw_gid)
            for parent in self.data_dir.parents:
                mode = parent.stat().st_mode
                if not mode & stat.S_IXOTH:
                    raise TargetError(
                        f"{parent} is not searchable by user {self.spec.data_owner!r} (mode {stat.filemode(mode)}), "
                        f"so the broker cannot reach {self.data_dir}; run with --out under a directory with o+x "
                        "(e.g. runs/ in the project)")
        if shutil.which(self.spec.start[0]) is None and not Path(self.spec.start[0]).exists():
            raise TargetError(f"[target] start = {list(self.spec.start)!r}: {self.spec.start[0]!r} is not "
                              "installed (not on PATH)")

    def start(self) -> None:
        from harness.node import ProcessNode

        argv = [self._format(a, "start") for a in self.spec.start]
        if os.geteuid() == 0 and shutil.which("unshare"):
            # A broker that drops root (setuid) loses PR_SET_PDEATHSIG, so it would outlive a killed harness.
            # So: unshare (root, dies with us) -> sh, PID 1 of a new PID namespace (root, killed by
            # --kill-child when unshare dies) -> the broker.  When PID 1 dies the kernel kills everything
            # in its namespace, the broker included.  Signals to the process group still reach the broker.
            argv = ["unshare", "--pid", "--fork", "--kill-child", "--", "/bin/sh", "-c",
                    '"$@" & child=$!; wait $child; exit $?', "ordeal-contain", *argv]
        self.node = ProcessNode(self.name, "mqtt-broker", self.host, self.port, argv,
                                log_path=self.log_dir / f"{self.name}.log", data_dir=self.data_dir,
                                cwd=self.run_dir)
        self.node.start()
        self._event("start", argv=argv, pid=self.node.pid)
        self.node.wait_ready(self.spec.ready_timeout_s)
        self._event("ready", pid=self.node.pid)

    def stop(self) -> None:
        if self.node is None:
            return
        pid = self.node.pid
        if self.spec.stop and self.node.is_alive():
            _run_argv([self._format(a, "stop") for a in self.spec.stop])
        self.node.stop()  # waits for the process; SIGTERM, then SIGKILL
        self._event("stop", pid=pid)

    def kill(self) -> None:
        if self.node is None:
            return
        pid = self.node.pid
        if self.spec.kill and self.node.is_alive():
            _run_argv([self._format(a, "kill") for a in self.spec.kill])
        self.node.kill()
        self._event("kill", pid=pid)

    def _event(self, action: str, **detail: Any) -> None:
        self.recorder.record(Kind.NODE_EVENT, node=self.name, detail={"action": action, **detail})

    def endpoints(self) -> list[Endpoint]:
        return [(self.host, self.port, self.name)]

    def client_bind_address(self) -> str:
        return ""

    def apply_presets(self, plan: Plan) -> list[str]:
        """Preset packet ids need the broker's storage: not possible for a black box."""
        if any(c.preset_last_packet_id for c in plan.clients):
            return ["preset_last_packet_id is ignored: an external target is a black box"]
        return []

    def snapshot(self, plan: Plan) -> int:
        return 0

    def queue_size_probe(self):
        """A black box: no Redis to look into."""
        return None

    def describe(self) -> dict[str, Any]:
        return {"kind": "external", "mqtt": {self.name: f"{self.host}:{self.port}"},
                "nodes": [self.node.describe()] if self.node is not None else []}


def _run_argv(argv: list[str]) -> None:
    try:
        subprocess.run(argv, check=False, timeout=30, stdin=subprocess.DEVNULL, capture_output=True)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise TargetError(f"running {shlex.join(argv)} failed: {error}") from error


class ReferenceTarget:
    """The reference broker on a local topology; white box (Redis snapshots after the drain)."""

    white_box = True

    def __init__(self, scenario: Scenario, run_dir: Path, recorder: HistoryRecorder):
        try:
            from harness.topology import LocalTopology
            from harness.topology_config import TopologyConfig
        except ImportError as error:
            raise TargetError(f"the reference target needs the local topology (harness/topology.py), which is "
                              f"not available yet: {error}") from error
        if not _reference_broker_available():
            raise TargetError("the reference broker (python -m reference_broker) is not available yet")
        self.scenario = scenario
        self.run_dir = Path(run_dir).resolve()
        self.recorder = recorder
        self.config = TopologyConfig.from_mapping(scenario.topology, source=f"{scenario.source} [topology]")
        self.topology = LocalTopology(self.config, self.run_dir, broker_config=self._write_broker_config)

    def _write_broker_config(self, topology: Any) -> Path:
        path = self.run_dir / "broker-config.json"
        path.write_text(json.dumps({
            "redis_startup_nodes": [f"{h}:{p}" for h, p in topology.redis_startup_nodes()],
            "kafka_bootstrap": topology.kafka_bootstrap(),
            "broker": dict(self.scenario.broker),
        }, indent=2, sort_keys=True))
        return path

    def prepare(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)

    def start(self) -> None:
        self.topology.start()
        for node in self.topology.nodes():
            self.recorder.record(Kind.NODE_EVENT, node=node.name,
                                 detail={"action": "ready", "role": node.role, "pid": node.pid,
                                         "address": node.address})

    def stop(self) -> None:
        names = [n.name for n in self.topology.nodes()]
        self.topology.stop()
        for name in names:
            self.recorder.record(Kind.NODE_EVENT, node=name, detail={"action": "stop"})

    def kill(self) -> None:
        self.stop()

    def endpoints(self) -> list[Endpoint]:
        return [(b.host, b.port, b.name) for b in self.topology.brokers]

    def client_bind_address(self) -> str:
        """With distinct node addresses (private netns) the clients own 127.0.0.1 (harness/addresses.py)."""
        return "127.0.0.1" if self.topology.addresses.mode == "distinct" else ""

    @property
    def key_prefix(self) -> str:
        return str(self.scenario.broker.get("key_prefix", ""))

    def _key_prefix(self) -> str:
        return self.key_prefix

    def apply_presets(self, plan: Plan) -> list[str]:
        from harness.snapshot import preset_last_packet_ids

        presets = {c.client_id: c.preset_last_packet_id for c in plan.clients if c.preset_last_packet_id}
        if presets:
            preset_last_packet_ids(self.topology.redis_startup_nodes(), self._key_prefix(), presets)
        return []

    def queue_size_probe(self):
        """``probe(client, why)`` recording the client's message-queue size (harness/snapshot.QueueSizeProbe)."""
        from harness.snapshot import QueueSizeProbe

        return QueueSizeProbe(self.topology.redis_startup_nodes(), self._key_prefix(), self.recorder)

    def snapshot(self, plan: Plan) -> int:
        from harness.snapshot import snapshot_sessions

        return snapshot_sessions(self.topology.redis_startup_nodes(), self._key_prefix(),
                                 [c.client_id for c in plan.subscribers()], self.recorder)

    def describe(self) -> dict[str, Any]:
        return {"kind": "reference", **self.topology.endpoints()}


def _reference_broker_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("reference_broker.__main__") is not None


def make_target(scenario: Scenario, run_dir: Path, recorder: HistoryRecorder) -> ExternalTarget | ReferenceTarget:
    if scenario.target.kind == "external":
        return ExternalTarget(scenario, run_dir, recorder)
    return ReferenceTarget(scenario, run_dir, recorder)
