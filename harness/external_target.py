"""The external target: any MQTT broker described by an address and start / stop / kill argv lists (e.g.
Debian's Mosquitto), run as a host process.  A black box (contracts.topology.Target with white_box false): no
snapshot rows.  It records a ``node_event`` row for every start / ready / stop / kill it performs.  The same
broker as a container: harness/containers/target.py; the reference broker: harness/reference_target.py.
"""

from __future__ import annotations

import os
import pwd
import shlex
import shutil
import socket
import stat
import subprocess
from pathlib import Path
from typing import Any

from contracts.credentials import PROBE_CLIENT_ID
from contracts.history_schema import Kind
from contracts.scenario import Scenario
from contracts.topology import Endpoint
from harness.history import HistoryRecorder
from harness.node import ProcessNode
from properties.plan import Plan


class TargetError(RuntimeError):
    """The target cannot be prepared or started; the message says what to change."""


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


class ExternalTopology:
    """What the nemesis (faults/) sees of an external target: one broker node, no Redis, no Kafka.  With its
    own 127.0.0.x address ("distinct", inside the run's private namespace) the clients keep 127.0.0.1, so
    client <-> broker network faults match packets by address exactly as on the reference topology."""

    redis_nodes: tuple = ()
    kafka = None
    storage = None
    config = None
    client_hosts = None
    network_fault_place = None

    def __init__(self, node: Any, address_mode: str) -> None:
        from harness.addresses import AddressPlan

        self.brokers = [node]
        self.addresses = AddressPlan(address_mode)

    def nodes(self) -> list[Any]:
        return list(self.brokers)


class ExternalTarget:
    """A black-box MQTT broker started from argv.  Placeholders {run_dir} {data_dir} {log_dir} {host} {port}
    {pid} in argv, env values and config files are replaced; {pid} is the started process (for stop / kill
    argv).  Inside the run's private network namespace it listens on its own 127.0.0.x (unless the scenario
    fixes a host), so network faults between the clients (127.0.0.1) and it can be applied."""

    white_box = False
    reuse = None  # never a kept topology
    reset_s = None

    def __init__(self, scenario: Scenario, run_dir: Path, recorder: HistoryRecorder):
        from harness import netns
        from harness.addresses import ALLOCATOR

        self.spec = scenario.target
        self.scenario = scenario
        self.run_dir = Path(run_dir).resolve()
        self.recorder = recorder
        self.name = self.spec.name
        self.address_mode = "loopback"
        if self.spec.host:
            self.host = self.spec.host
            self.port = self.spec.port or free_port(self.host)
        elif netns.in_private_netns():
            self.address_mode = "distinct"
            self.host, self.port = ALLOCATOR.distinct(self.spec.port or 1883)
        else:
            self.host = "127.0.0.1"
            self.port = self.spec.port or free_port(self.host)
        self.data_dir = self.run_dir / "data" / self.name
        self.log_dir = self.run_dir / "logs"
        self.node = None
        self.topology: ExternalTopology | None = None

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
        files = dict(self.spec.files)
        if self.spec.config_file:
            files[self.spec.config_file] = self.spec.config_text
        for file_name, text in files.items():
            where = "config_text" if file_name == self.spec.config_file else f"files.{file_name}"
            (self.run_dir / file_name).write_text(self._format(text, where))
        if self.spec.data_owner and os.geteuid() == 0:
            try:
                owner = pwd.getpwnam(self.spec.data_owner)
            except KeyError:
                raise TargetError(f"[target] data_owner = {self.spec.data_owner!r}: no such user on this machine") from None
            for directory in (self.data_dir, self.log_dir):
                os.chown(directory, owner.pw_uid, owner.pw_gid)
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

    def _ready(self, node: Any) -> bool:
        if self.spec.ready == "port":
            from harness.node import port_accepts

            return port_accepts(node.host, node.port)
        level = self.spec.protocol_levels[0]
        result = self._probe(node.host, node.port, level, timeout_s=1.0)
        self._refuse_if_credentials_refused(result, level)
        return result.ok

    def _probe(self, host: str, port: int, level: int, timeout_s: float = 2.0) -> Any:
        """One CONNECT of the harness's probe, with the credentials its client id gets ([target.credentials])."""
        from harness import mqtt_probe

        credential = self.spec.credentials.for_client(PROBE_CLIENT_ID)
        return mqtt_probe.mqtt_connect(host, port, level=level, timeout_s=timeout_s, client_id=PROBE_CLIENT_ID,
                                       username=credential.username if credential is not None else None,
                                       password=credential.password if credential is not None else None)

    def _refuse_if_credentials_refused(self, result: Any, level: int) -> None:
        """A CONNACK refusing the probe's credentials ends the start at once (TargetError, the run unknown):
        the broker answered, and waiting would not change its answer."""
        if result.refused_credentials:
            from harness.connack import refusal_message

            credential = self.spec.credentials.for_client(PROBE_CLIENT_ID)
            raise TargetError(refusal_message(
                self.name, PROBE_CLIENT_ID, level, result.code, credential.username if credential else None,
                credential is not None and credential.password is not None))

    def start(self) -> None:
        argv = [self._format(a, "start") for a in self.spec.start]
        if os.geteuid() == 0 and shutil.which("unshare"):
            # A broker that drops root (setuid) loses PR_SET_PDEATHSIG, so it would outlive a killed harness.
            # So: unshare (root, dies with us) -> sh, PID 1 of a new PID namespace (root, killed by
            # --kill-child when unshare dies) -> the broker.  When PID 1 dies the kernel kills everything
            # in its namespace, the broker included.  Signals to the process group still reach the broker.
            # --mount-proc: the broker's own /proc for its PID namespace (RabbitMQ's memory monitor reads
            # /proc/<its pid>/...; with the outer /proc it fails to boot after a restart).
            argv = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--", "/bin/sh", "-c",
                    '"$@" & child=$!; wait $child; exit $?', "ordeal-contain", *argv]
        # The variables [target.credentials] reads, with the values the clients send (a default filled in),
        # so a start command can make the broker's password file from them; [target] env may override.
        env = {**self.spec.credentials.environment(),
               **{key: self._format(value, f"env.{key}") for key, value in self.spec.env}}
        self.node = ExternalNode(self, self.name, "mqtt-broker", self.host, self.port, argv,
                                 log_path=self.log_dir / f"{self.name}.log", data_dir=self.data_dir,
                                 cwd=self.run_dir, env=env, ready_check=self._ready)
        self.topology = ExternalTopology(self.node, self.address_mode)
        self.node.start()
        self._event("start", argv=argv, pid=self.node.pid)
        self.node.wait_ready(self.spec.ready_timeout_s)
        self._event("ready", pid=self.node.pid)
        self.check_protocols()

    def check_protocols(self) -> None:
        """Every protocol level the workload sends must get a CONNACK 0 (an honest unknown otherwise:
        'CONNECT refused for protocol version 5: ...', not 'no client could connect')."""
        from harness.mqtt_probe import LEVEL_NAMES

        for level, weight in self.scenario.workload.protocol_mix:
            if weight <= 0:
                continue
            result = self._probe(self.host, self.port, level)
            self._event("protocol_probe", level=level, ok=result.ok, answer=result.detail)
            self._refuse_if_credentials_refused(result, level)
            if not result.ok:
                raise TargetError(f"{self.name} refused an MQTT CONNECT for protocol version "
                                  f"{LEVEL_NAMES.get(level, level)} ({result.detail}); the workload sends it")

    def stop(self) -> None:
        if self.node is None:
            return
        pid = self.node.pid
        self.node.stop()  # the stop argv if any, then SIGTERM, then SIGKILL; waits for the process
        self._event("stop", pid=pid)

    def kill(self) -> None:
        if self.node is None:
            return
        pid = self.node.pid
        self.node.kill()
        self._event("kill", pid=pid)

    def _event(self, action: str, **detail: Any) -> None:
        self.recorder.record(Kind.NODE_EVENT, node=self.name, detail={"action": action, **detail})

    def endpoints(self) -> list[Endpoint]:
        return [(self.host, self.port, self.name)]

    def client_bind_address(self) -> str:
        """On its own address, the clients keep 127.0.0.1 (as with the reference topology's distinct mode)."""
        return "127.0.0.1" if self.address_mode == "distinct" else ""

    @property
    def key_prefix(self) -> str:
        return ""

    @property
    def heal_ready_timeout_s(self) -> float:
        """A broker that boots slowly (RabbitMQ: tens of seconds) must be waited for as long as at start."""
        return self.spec.ready_timeout_s

    def log_files(self) -> None:
        """Its log is the started node's (harness/node_logs.py reads it from the node)."""
        return None

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
                "address_mode": self.address_mode, "promises": self.spec.declaration(),
                "nodes": [self.node.describe()] if self.node is not None else []}


class ExternalNode(ProcessNode):
    """The broker's process tree; stop / kill run the scenario's argv first (e.g. `rabbitmqctl stop`), then
    the usual SIGTERM / SIGKILL of the process group, so the same handle serves the nemesis."""

    def __init__(self, target: ExternalTarget, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.target = target

    def stop(self, timeout: float = 10.0) -> None:
        if self.target.spec.stop and self.is_alive():
            _run_argv([self.target._format(a, "stop") for a in self.target.spec.stop], self.env)
        super().stop(timeout)

    def kill(self) -> None:
        if self.target.spec.kill and self.is_alive():
            _run_argv([self.target._format(a, "kill") for a in self.target.spec.kill], self.env)
        super().kill()


def _run_argv(argv: list[str], env: dict[str, str] | None = None) -> None:
    try:
        subprocess.run(argv, check=False, timeout=30, stdin=subprocess.DEVNULL, capture_output=True,
                       env={**os.environ, **env} if env else None)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise TargetError(f"running {shlex.join(argv)} failed: {error}") from error
