"""The external target: any MQTT broker, one node or a cluster of them, each described by an address and
start / stop / kill argv lists (e.g. Debian's Mosquitto, a three-node RabbitMQ), run as host processes.  A
black box (contracts.topology.Target with white_box false): no snapshot rows.  It records a ``node_event`` row
for every start / ready / stop / kill / formation step it performs, and for every exit nobody asked for.  The same
broker as a container: harness/containers/target.py; the reference broker: harness/reference_target.py.
"""

from __future__ import annotations

import os
import pwd
import re
import shlex
import shutil
import socket
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from contracts.credentials import PROBE_CLIENT_ID
from contracts.history_schema import Kind
from contracts.scenario import Scenario
from contracts.target_nodes import BROKER, SERVICE, NodeSpec
from contracts.topology import Endpoint
from harness.death_watch import ProbeAnswer
from harness.history import HistoryRecorder
from harness.node import ProcessNode
from harness.tls import client_tls, tls_placeholders, write_target_tls
from properties.plan import Plan


class TargetError(RuntimeError):
    """The target cannot be prepared or started; the message says what to change."""


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


class ExternalTopology:
    """What the nemesis (faults/) sees of an external target: its broker nodes and the processes inside it
    (``services``), no Redis, no Kafka.  With their own 127.0.0.x addresses ("distinct", inside the run's
    private namespace) the clients keep 127.0.0.1, so client <-> node and node <-> node network faults match
    packets by address exactly as on the reference topology."""

    redis_nodes: tuple = ()
    kafka = None
    storage = None
    config = None
    client_hosts = None
    network_fault_place = None

    def __init__(self, target: ExternalTarget, address_mode: str) -> None:
        from harness.addresses import AddressPlan

        self.target = target
        self.brokers = [node for node in target.nodes if node.role != SERVICE]
        self.services = [node for node in target.nodes if node.role == SERVICE]
        self.addresses = AddressPlan(address_mode)

    def nodes(self) -> list[Any]:
        return list(self.services) + list(self.brokers)

    def holding_node(self, client_id: str) -> str:
        """broker-holding:CLIENT (faults/selectors.py): the target's own answer."""
        return self.target.holding_node(client_id)

    def wait_ready(self, timeout_s: float) -> None:
        """After every fault is healed (the nemesis' heal_all): a cluster has formed again, in its own words."""
        if self.target.formed:
            self.target.wait_formed(max(timeout_s, self.target.spec.formation.ready_timeout_s), why="heal_all")


class ExternalTarget:
    """A black-box MQTT broker of one or several nodes, each started from argv (contracts/target_nodes.py).
    Placeholders {run_dir} {data_dir} {log_dir} {conf_dir} {host} {port} {pid} {node} and
    {nodes[NAME].host} (.port .name .data_dir .conf_dir) in argv, env values and config files are replaced;
    {pid} is the node's started process (for stop / kill argv).  Inside the run's private network namespace
    each node listens on its own 127.0.0.x (unless the scenario fixes a host), so network faults between the
    clients (127.0.0.1) and a node, or between two nodes, can be applied."""

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
        self.log_dir = self.run_dir / "logs"
        self.address_mode = "distinct" if netns.in_private_netns() else "loopback"
        self.node_specs = self.spec.node_specs()  # every node with the target's keys filled in
        self.places: dict[str, NodePlace] = {}
        for node in self.node_specs:
            if node.host:
                host, port = node.host, node.port or free_port(node.host)
            elif self.address_mode == "distinct":
                host, port = ALLOCATOR.distinct(node.port or 1883)
            else:
                host, port = "127.0.0.1", node.port or free_port("127.0.0.1")
            conf_dir = self.run_dir / "conf" / node.name if self.spec.clustered else self.run_dir
            self.places[node.name] = NodePlace(node.name, host, port, self.run_dir / "data" / node.name, conf_dir)
        if any(node.host for node in self.node_specs):
            self.address_mode = "loopback"  # a host the scenario fixes: the clients keep the default source
        taken: dict[tuple[str, int], str] = {}
        for place in self.places.values():
            if (place.host, place.port) in taken:
                raise TargetError(f"[[target.nodes]] {place.name!r} and {taken[place.host, place.port]!r} would both "
                                  f"listen on {place.host}:{place.port} (this run is not in a private network "
                                  "namespace, so the nodes share 127.0.0.1); give each node its own port")
            taken[place.host, place.port] = place.name
        # The first broker node's: where the protocol probe goes (a service node speaks no MQTT).
        self.first_broker = self.spec.broker_node_names()[0]
        first = self.places[self.first_broker]
        self.host, self.port, self.data_dir = first.host, first.port, first.data_dir
        self.nodes: list[ExternalNode] = []
        self.node = None  # the first broker node (single-node targets)
        self.topology: ExternalTopology | None = None
        self.formed = False
        self.client_node: Any = None  # client id -> node name of its current / last connection (the executor)
        self.tls: dict[str, Any] | None = None  # [target.tls]: what prepare() made (paths, names; never the key)
        # faults/power.py power_loss: the nodes whose data dirs go on lazyfs (prepare_power, from the plan), and
        # their mounts (harness/power.py PowerMounts), from the nodes' first start until after their stop.
        self.power_nodes: tuple[str, ...] = ()
        self.power_mounts: Any = None
        self.clocks: Any = None  # faults/libfaketime.py ClockSetup when the plan has a clock fault (prepare_clocks)

    # -- placeholders --------------------------------------------------------------------------------

    def _values(self, node: str | None = None) -> dict[str, Any]:
        place = self.places[node or self.first_broker]
        handle = next((n for n in self.nodes if n.name == place.name), None)
        nodes = {p.name: SimpleNamespace(name=p.name, host=p.host, port=p.port, data_dir=p.data_dir,
                                         conf_dir=p.conf_dir) for p in self.places.values()}
        # One node: its address is the target's (a provider may place it elsewhere: harness/containers/).
        host, port = (place.host, place.port) if self.spec.clustered else (self.host, self.port)
        return {"run_dir": self.run_dir, "data_dir": place.data_dir, "log_dir": self.log_dir,
                "conf_dir": place.conf_dir, "host": host, "port": port, "node": place.name,
                "nodes": nodes, "pid": handle.pid if handle is not None and handle.pid else "",
                **tls_placeholders(self.run_dir, self.spec.tls)}  # [target.tls]: {tls_ca} {tls_cert} {tls_key} {tls_dir}

    def _format(self, text: str, where: str, node: str | None = None, **extra: Any) -> str:
        try:
            return text.format(**self._values(node), **extra)
        except (KeyError, IndexError, ValueError, AttributeError) as error:
            allowed = "{run_dir} {data_dir} {log_dir} {conf_dir} {host} {port} {pid} {node} {nodes[NAME].host}"
            raise TargetError(f"[target] {where}: cannot fill in placeholders in {text!r}: {error!r}; allowed: "
                              f"{allowed} (.port .name .data_dir .conf_dir; node names: "
                              f"{', '.join(self.places)}; double braces for a literal)") from error

    # -- life cycle ----------------------------------------------------------------------------------

    def prepare(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for node in self.node_specs:
            place = self.places[node.name]
            place.data_dir.mkdir(parents=True, exist_ok=True)
            place.conf_dir.mkdir(parents=True, exist_ok=True)
            files = dict(node.files)
            if self.spec.config_file:
                files[self.spec.config_file] = self.spec.config_text
            for file_name, text in files.items():
                where = "config_text" if file_name == self.spec.config_file else f"files.{file_name}"
                (place.conf_dir / file_name).write_text(self._format(text, where, node.name))
            if self.spec.data_owner and os.geteuid() == 0:
                self._chown(place.data_dir)
            if shutil.which(node.start[0]) is None and not Path(node.start[0]).exists():
                where = f"[[target.nodes]] {node.name!r} start" if self.spec.clustered else "start"
                raise TargetError(f"[target] {where} = {list(node.start)!r}: {node.start[0]!r} is not "
                                  "installed (not on PATH)")
        # [target.tls]: the run's CA and a server certificate for every node's address, into {run_dir}/tls/
        self.tls = write_target_tls(self.run_dir, self.spec.tls, [self.host, *(p.host for p in self.places.values())],
                                    owner=self.spec.data_owner)

    def prepare_clocks(self, plan: Plan) -> list[str]:
        """Before the nodes start: when the plan holds a clock fault (faults/clock.py), every node starts under
        libfaketime (its start command and whatever it execs: a dynamically linked runtime reads the offset from
        <run_dir>/clock/<node> on every wall-clock call).  Nothing when the plan has none."""
        from faults.clock import CLOCK_KINDS
        from faults.libfaketime import CLOCK_DIR, ClockError, ClockSetup, libfaketime_problem

        if not any(fault.kind in CLOCK_KINDS for fault in plan.faults):
            return []
        if type(self).start is not ExternalTarget.start:
            raise ClockError(f"clock faults preload libfaketime into the processes the harness starts; the "
                             f"{type(self).__name__} target's nodes are not started that way")
        problem = libfaketime_problem()
        if problem:
            raise ClockError(problem)
        self.clocks = ClockSetup(self.run_dir / CLOCK_DIR, frozenset({"mqtt-broker", SERVICE}))
        return [f"clock faults: every node of {self.name} runs under libfaketime (offset files in {CLOCK_DIR}/)"]

    def prepare_power(self, plan: Plan) -> list[str]:
        """Before the nodes start: when the plan holds a power_loss fault, put the data directory of every node it
        may hit on a lazyfs mount of its own (harness/power.py), so that what the broker did not fsync can be
        dropped.  Only a directory the harness gives the node ({data_dir} in its start argv, env or config)
        can be: a node that keeps its data elsewhere is refused here, before anything starts (TargetError:
        the run is unknown, with the reason).  Nothing when the plan has none."""
        from faults.power import external_power_refusal, external_reach
        from harness.power import LAZYFS_DIR, POWER_KINDS, harness_data_dirs, planned_power_loss

        if not planned_power_loss(plan.faults):
            return []
        if type(self).start is not ExternalTarget.start:  # e.g. the containers provider: its own start, no mounts
            raise TargetError(f"[faults] power_loss: {type(self).__name__} starts its nodes itself, without the "
                              "lazyfs data directories a power loss needs (docs/faults.md, PROVIDER_GAPS)")
        own = harness_data_dirs(self.node_specs, self.spec.config_text if self.spec.config_file else "")
        nodes = tuple((spec.name, spec.role, own[spec.name]) for spec in self.node_specs)
        selectors = tuple(sorted({fault.target for fault in plan.faults if fault.kind in POWER_KINDS}))
        why = external_power_refusal(selectors, nodes)
        if why:
            raise TargetError(f"[faults] {why}")
        reached = {name for selector in selectors for name in external_reach(selector, nodes)}
        self.power_nodes = tuple(spec.name for spec in self.node_specs if spec.name in reached)
        return [f"power_loss: the data directory of {', '.join(self.power_nodes) or 'no node'} is a lazyfs mount "
                f"(backing dirs in {LAZYFS_DIR}/, unsynced file data held until fsync: harness/lazyfs/)"]

    def _mount_power(self) -> None:
        """Mount the lazyfs data directories (prepare_power) before the first start; the data owner must own
        the mount's root (the backing directory) as it owned the plain directory."""
        from harness.power import PowerMounts

        nodes = [node for node in self.nodes if node.name in self.power_nodes]
        if not nodes:
            return
        self.power_mounts = PowerMounts.start(nodes, self.run_dir)
        if self.spec.data_owner and os.geteuid() == 0:
            for node in nodes:
                self._chown(node.data_dir)
        for node in nodes:
            self._event("lazyfs_mounted", node, mountpoint=str(node.data_dir), backing=str(node.lazyfs.backing))

    def _unmount_power(self) -> None:
        """After the nodes on them are gone (a mount with a process still in it would not go)."""
        mounts, self.power_mounts = self.power_mounts, None
        if mounts is not None:
            mounts.stop()

    def _chown(self, data_dir: Path) -> None:
        try:
            owner = pwd.getpwnam(self.spec.data_owner)
        except KeyError:
            raise TargetError(f"[target] data_owner = {self.spec.data_owner!r}: no such user on this machine") from None
        for directory in (data_dir, self.log_dir):
            os.chown(directory, owner.pw_uid, owner.pw_gid)
        for parent in data_dir.parents:
            mode = parent.stat().st_mode
            if not mode & stat.S_IXOTH:
                raise TargetError(
                    f"{parent} is not searchable by user {self.spec.data_owner!r} (mode {stat.filemode(mode)}), "
                    f"so the broker cannot reach {data_dir}; run with --out under a directory with o+x "
                    "(e.g. runs/ in the project)")

    def _ready(self, node: Any) -> bool:
        return self.answers(node).ok

    def answers(self, node: Any) -> ProbeAnswer:
        """The node's ready check, in words: an MQTT CONNECT gets a CONNACK 0 ("mqtt") or the port accepts
        TCP ("port").  The run's health probe asks the same while the workload runs (harness/death_watch.py)."""
        if getattr(node, "ready_kind", self.spec.ready) == "port":
            from harness.node import port_accepts

            ok = port_accepts(node.host, node.port)
            return ProbeAnswer(f"TCP connect {node.host}:{node.port}", None if ok else "the port refuses connections")
        level = self.spec.protocol_levels[0]
        result = self._probe(node.host, node.port, level, timeout_s=1.0)
        self._refuse_if_credentials_refused(result, level)
        return ProbeAnswer(f"MQTT CONNECT {node.host}:{node.port}", None if result.ok else result.detail)

    def _probe(self, host: str, port: int, level: int, timeout_s: float = 2.0) -> Any:
        """One CONNECT of the harness's probe, with the credentials its client id gets ([target.credentials])."""
        from harness import mqtt_probe

        credential = self.spec.credentials.for_client(PROBE_CLIENT_ID)
        result = mqtt_probe.mqtt_connect(host, port, level=level, timeout_s=timeout_s, client_id=PROBE_CLIENT_ID,
                                         username=credential.username if credential is not None else None,
                                         password=credential.password if credential is not None else None,
                                         tls=client_tls(self.run_dir, self.spec.tls))
        if result.tls_failed:  # [target.tls]: the broker answered; waiting will not change its certificate
            raise TargetError(f"{self.name} ({host}:{port}): {result.detail}")
        return result

    def _refuse_if_credentials_refused(self, result: Any, level: int) -> None:
        """A CONNACK refusing the probe's credentials ends the start at once (TargetError, the run unknown):
        the broker answered, and waiting would not change its answer."""
        if result.refused_credentials:
            from harness.connack import refusal_message

            credential = self.spec.credentials.for_client(PROBE_CLIENT_ID)
            raise TargetError(refusal_message(
                self.name, PROBE_CLIENT_ID, level, result.code, credential.username if credential else None,
                credential is not None and credential.password is not None))

    def _make_node(self, spec: NodeSpec) -> ExternalNode:
        place = self.places[spec.name]
        where = f"[[target.nodes]] {spec.name!r} " if self.spec.clustered else ""
        argv = [self._format(a, f"{where}start", spec.name) for a in spec.start]
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
               **{key: self._format(value, f"{where}env.{key}", spec.name) for key, value in spec.env}}
        role = "mqtt-broker" if spec.role == BROKER else SERVICE
        clock = self.clocks.env_for(spec.name, role) if self.clocks is not None else None
        if clock:  # prepare_clocks: the node's wall clock follows its offset file
            env = {**env, **clock}
        node = ExternalNode(self, spec, spec.name, role, place.host, place.port, argv,
                            log_path=self.log_dir / f"{spec.name}.log", data_dir=place.data_dir,
                            cwd=self.run_dir, env=env, ready_check=self._ready)
        return node

    def start(self) -> None:
        self.nodes = [self._make_node(spec) for spec in self.node_specs]
        self.node = next(node for node in self.nodes if node.role == "mqtt-broker")
        self.topology = ExternalTopology(self, self.address_mode)
        # Services (a database behind the broker) first and ready, then every broker node at once: the
        # nodes of a cluster find each other while they boot, so starting them one after another could wait
        # for a formation that needs the later ones; [target.formation] start = "in_order" does that instead
        # (RabbitMQ 3.10's MQTT plugin sometimes elects no leader when three nodes boot at once).
        services = [node for node in self.nodes if node.role == SERVICE]
        brokers = [node for node in self.nodes if node.role != SERVICE]
        together = self.spec.formation.start == "together"
        self._mount_power()
        for group in [services] + ([brokers] if together else [[node] for node in brokers]):
            for node in group:
                node.start()
                self._event("start", node, argv=node.argv, pid=node.pid)
            for node in group:
                node.wait_ready(node.spec.ready_timeout_s)
                self._event("ready", node, pid=node.pid)
        self.form()
        if self.power_mounts is not None:
            # What the broker wrote while it booted (RabbitMQ's Mnesia schema, say) counts as written back, as a
            # kernel does within its dirty-page expiry (30 s): lazyfs writes nothing back by itself, and a power
            # loss should take what the broker wrote under load, not undo its installation (harness/power.py).
            settled = self.power_mounts.settle()
            self.recorder.record(Kind.NODE_EVENT, node=self.name, detail={"action": "lazyfs_settled",
                                                                         "bytes_written": settled})
        self.check_protocols()

    def form(self) -> None:
        """[target.formation]: the join steps once, then its readiness (the cluster formed)."""
        formation = self.spec.formation
        for index, step in enumerate(formation.steps, start=1):
            argv = [self._format(a, f"formation.steps[{index}]") for a in step]
            result = _run_argv(argv, self._formation_env(), check=True, where=f"[target.formation] steps[{index}]")
            self.recorder.record(Kind.NODE_EVENT, node=self.name, detail={
                "action": "formation_step", "argv": argv, "exit": result.returncode})
        self.wait_formed(formation.ready_timeout_s, why="start")
        self.formed = True

    def wait_formed(self, timeout_s: float, why: str) -> None:
        """Poll [target.formation] ready until it exits 0; the cluster's own word that every node is back."""
        ready = self.spec.formation.ready
        if not ready:
            return
        argv = [self._format(a, "formation.ready") for a in ready]
        deadline = time.monotonic() + timeout_s
        mark = time.monotonic()
        while True:
            result = _run_argv(argv, self._formation_env(), where="[target.formation] ready")
            if result.returncode == 0:
                self.recorder.record(Kind.NODE_EVENT, node=self.name, detail={
                    "action": "formed", "why": why, "waited_s": round(time.monotonic() - mark, 3)})
                return
            if time.monotonic() > deadline:
                raise TargetError(f"{self.name}: the cluster did not form within {timeout_s:.0f} s ({why}): "
                                  f"{shlex.join(argv)} exited {result.returncode}: "
                                  f"{(result.stdout + result.stderr).strip()[-600:]}")
            time.sleep(1.0)

    def _formation_env(self) -> dict[str, str]:
        """Formation commands run with the first node's environment (e.g. HOME holding an Erlang cookie)."""
        first = self.node_specs[0]
        return {**self.spec.credentials.environment(),
                **{key: self._format(value, f"env.{key}", first.name) for key, value in first.env}}

    def holding_node(self, client_id: str) -> str:
        """The node holding a client's session: [target.formation] holding's output names it (a node name or
        its address, as a whole word); without that command, the node of the client's current or last
        connection.  FaultNotApplicable when neither can tell."""
        from faults.base import FaultNotApplicable

        command = self.spec.formation.holding
        if command:
            argv = [self._format(a, "formation.holding", client=client_id) for a in command]
            result = _run_argv(argv, self._formation_env(), where="[target.formation] holding")
            text = result.stdout + result.stderr
            found = [node.name for node in self.nodes if node.role == "mqtt-broker" and (
                re.search(rf"(?<![\w.-]){re.escape(node.name)}(?![\w-])", text)
                or re.search(rf"(?<![\d.]){re.escape(node.host)}(?![\d])", text))]
            if len(found) == 1:
                return found[0]
            raise FaultNotApplicable(f"broker-holding:{client_id}: {shlex.join(argv)} named "
                                     f"{'no node' if not found else 'several nodes ' + ', '.join(found)} "
                                     f"(output: {text.strip()[-300:]!r})")
        name = self.client_node(client_id) if callable(self.client_node) else None
        if not name:
            raise FaultNotApplicable(f"broker-holding:{client_id}: {client_id!r} has not connected yet, and the "
                                     "target declares no [target.formation] holding command")
        return name

    def check_protocols(self) -> None:
        """Every protocol level the workload sends must get a CONNACK 0 (an honest unknown otherwise:
        'CONNECT refused for protocol version 5: ...', not 'no client could connect')."""
        from harness.mqtt_probe import LEVEL_NAMES

        for level, weight in self.scenario.workload.protocol_mix:
            if weight <= 0:
                continue
            result = self._probe(self.host, self.port, level)
            self._event("protocol_probe", self.node, level=level, ok=result.ok, answer=result.detail)
            self._refuse_if_credentials_refused(result, level)
            if not result.ok:
                raise TargetError(f"{self.name} refused an MQTT CONNECT for protocol version "
                                  f"{LEVEL_NAMES.get(level, level)} ({result.detail}); the workload sends it")

    def stop(self) -> None:
        # Brokers before the services they use, the last-started first.
        try:
            for node in reversed(self.nodes):
                pid = node.pid
                node.stop()  # the stop argv if any, then SIGTERM, then SIGKILL; waits for the process
                self._event("stop", node, pid=pid)
        finally:
            self._unmount_power()

    def kill(self) -> None:
        try:
            for node in reversed(self.nodes):
                pid = node.pid
                node.kill()
                self._event("kill", node, pid=pid)
        finally:
            self._unmount_power()

    def _event(self, action: str, node: Any = None, **detail: Any) -> None:
        self.recorder.record(Kind.NODE_EVENT, node=node.name if node is not None else self.name,
                             detail={"action": action, **detail})

    def endpoints(self) -> list[Endpoint]:
        """The broker nodes in declaration order: node index 0, 1, ... of the plan."""
        if not self.spec.clustered:
            return [(self.host, self.port, self.name)]
        return [(self.places[name].host, self.places[name].port, name) for name in self.spec.broker_node_names()]

    def client_bind_address(self) -> str:
        """On its own address, the clients keep 127.0.0.1 (as with the reference topology's distinct mode)."""
        return "127.0.0.1" if self.address_mode == "distinct" else ""

    @property
    def key_prefix(self) -> str:
        return ""

    @property
    def heal_ready_timeout_s(self) -> float:
        """A broker that boots slowly (RabbitMQ: tens of seconds) must be waited for as long as at start, and a
        cluster also until it has formed again."""
        longest = max(spec.ready_timeout_s for spec in self.node_specs)
        return longest + (self.spec.formation.ready_timeout_s if self.spec.formation.ready else 0.0)

    def log_files(self) -> None:
        """Its logs are the started nodes' (harness/node_logs.py reads them from the nodes)."""
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
        brokers = list(self.spec.broker_node_names())
        described = {"kind": "external", "mqtt": {name: f"{self.places[name].host}:{self.places[name].port}"
                                                  for name in brokers},
                     "address_mode": self.address_mode, "promises": self.spec.declaration(),
                     "nodes": [node.describe() for node in self.nodes]}
        if self.tls:
            described["tls"] = self.tls
        if self.power_mounts is not None:  # faults/power.py: the lazyfs data dirs
            described["lazyfs"] = self.power_mounts.describe()
        if self.spec.clustered:
            described["cluster"] = {"name": self.name, "brokers": brokers,
                                    "services": [spec.name for spec in self.node_specs if spec.role == SERVICE],
                                    "formation": self.spec.formation.to_dict()}
        return described


@dataclass(frozen=True)
class NodePlace:
    """Where one node lives: its address and its directories."""

    name: str
    host: str
    port: int
    data_dir: Path
    conf_dir: Path


class ExternalNode(ProcessNode):
    """One node's process tree; stop / kill run the scenario's argv first (e.g. `rabbitmqctl stop`), then
    the usual SIGTERM / SIGKILL of the process group, so the same handle serves the nemesis.  Back from a
    fault, it is ready when it answers and, in a cluster, when the cluster says it has formed again."""

    def __init__(self, target: ExternalTarget, spec: NodeSpec, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.target = target
        self.spec = spec
        self.ready_kind = spec.ready or target.spec.ready
        self.rejoining = False

    def start(self) -> None:
        super().start()
        self.rejoining = self.target.formed  # started again after the cluster formed: it must rejoin

    def wait_ready(self, timeout: float = 30.0) -> None:
        super().wait_ready(timeout)
        if self.rejoining:
            self.target.wait_formed(self.target.spec.formation.ready_timeout_s, why=f"{self.name} back")
            self.rejoining = False

    def stop(self, timeout: float = 10.0) -> None:
        self.down_on_purpose = True
        if self.spec.stop and self.is_alive():
            _run_argv([self.target._format(a, "stop", self.name) for a in self.spec.stop], self.env)
        super().stop(timeout)

    def kill(self) -> None:
        self.down_on_purpose = True
        if self.spec.kill and self.is_alive():
            _run_argv([self.target._format(a, "kill", self.name) for a in self.spec.kill], self.env)
        super().kill()


def _run_argv(argv: list[str], env: dict[str, str] | None = None, *, check: bool = False,
              where: str = "") -> subprocess.CompletedProcess:
    """Run one of the target's commands (stop, kill, a formation step) to its end; ``check``: a non-zero exit
    is a TargetError naming ``where`` and the command's output."""
    try:
        result = subprocess.run(argv, check=False, timeout=60, stdin=subprocess.DEVNULL, capture_output=True,
                                text=True, env={**os.environ, **env} if env else None)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise TargetError(f"{where + ': ' if where else ''}running {shlex.join(argv)} failed: {error}") from error
    if check and result.returncode != 0:
        raise TargetError(f"{where + ': ' if where else ''}{shlex.join(argv)} exited {result.returncode}: "
                          f"{(result.stdout + result.stderr).strip()[-600:]}")
    return result
