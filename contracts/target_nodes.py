"""The nodes of an external target: one broker process, or a cluster of them, with the processes inside the
target (a database behind the broker) as nodes of their own, and the step that forms the cluster.

    [target]                       # what every node shares: start, stop, kill, env, files, ready ...
    [[target.nodes]]               # one table per node; a key given here overrides the target's
    name = "rabbit1"
    [target.formation]             # once every node is ready: join steps, then "formed" readiness
    steps = [["rabbitmqctl", ...]]
    ready = ["rabbitmqctl", "-n", "rabbit@{nodes[rabbit1].host}", "await_online_nodes", "3"]

A target without ``[[target.nodes]]`` is one node named like the target, with the target's keys: single-node
scenarios read exactly as before.  Pure data and validation (no stage imports); harness/external_target.py
starts what this describes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from contracts.validation import Section

BROKER, SERVICE = "broker", "service"  # an MQTT listener clients connect to; a process inside the target
NODE_ROLES = (BROKER, SERVICE)
READY_CHECKS = ("mqtt", "port")  # "mqtt": an MQTT CONNECT gets a CONNACK; "port": the port accepts TCP
HOME_NODE_POLICIES = ("round-robin", "seeded")
START_ORDERS = ("together", "in_order")
MAX_NODES = 16  # each node a process (often a VM) of its own on the run's machine


# -- keys a node and the target read alike (the target's [target], each node's [[target.nodes]]) ---------------

def read_name(s: Section, default: str, *, what: str, required: bool = False) -> str:
    """A node name: it names log files and directories, so letters, digits, '-' and '_' only."""
    name = s.string("name", default, required=required, non_empty=True)
    if not all(c.isalnum() or c in "-_" for c in name):
        raise s.fail("name", name, f"may only contain letters, digits, '-' and '_' (it names {what})")
    return name


def read_host(s: Section) -> str:
    host = s.string("host", "")
    if host and not host.startswith("127."):
        raise s.fail("host", host, "must be a loopback address (127.0.0.0/8), or empty to let the run pick one "
                     "(its own address inside the run's private namespace); traffic stays on this machine")
    return host


def read_env(s: Section) -> tuple[tuple[str, str], ...]:
    env = s.raw_table("env")
    for var, value in env.items():
        if not isinstance(value, str) or not var.replace("_", "").isalnum():
            raise s.fail(f"env.{var}", value, "must be NAME = \"value\" (a string; names of letters, digits, _)")
    return tuple(sorted(env.items()))


def read_files(s: Section, *, written_to: str) -> tuple[tuple[str, str], ...]:
    files = s.raw_table("files")
    for file_name, text in files.items():
        if not isinstance(text, str):
            raise s.fail(f"files.{file_name}", text, "must be the file's text (a string)")
        if "/" in file_name or file_name.startswith(".") or not file_name:
            raise s.fail(f"files.{file_name}", "...", f"the key must be a plain file name (written into {written_to})")
    return tuple(sorted(files.items()))


@dataclass(frozen=True)
class NodeSpec:
    """One node as declared.  ``None`` / empty means "the target's" (TargetSpec.node_specs fills it in)."""

    name: str
    role: str = "broker"
    host: str = ""
    port: int = 0
    start: tuple[str, ...] = ()
    stop: tuple[str, ...] = ()
    kill: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()  # merged over the target's env
    files: tuple[tuple[str, str], ...] = ()  # added to (or replacing) the target's files for this node
    ready: str = ""
    ready_timeout_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """As declared (so a scenario.json reads back to the same scenario): defaults left out."""
        out: dict[str, Any] = {"name": self.name}
        for key, value in asdict(self).items():
            if key == "name" or value in ("", 0, (), None) or (key == "role" and value == BROKER):
                continue
            out[key] = dict(value) if key in ("env", "files") else list(value) if isinstance(value, tuple) else value
        return out


@dataclass(frozen=True)
class FormationSpec:
    """How the nodes become one cluster: ``steps`` run once, in order, after every node is ready; ``ready``
    is polled (exit status 0 = formed) after the steps and again after a node of it comes back from a fault
    (the cluster re-formed); ``holding`` prints text naming the node that holds a client's session (its
    name or its address), for the ``broker-holding:CLIENT`` selector.  Empty: no such step."""

    steps: tuple[tuple[str, ...], ...] = ()
    ready: tuple[str, ...] = ()
    ready_timeout_s: float = 120.0
    holding: tuple[str, ...] = ()
    # "together": every broker node started at once, then each waited for (peers find each other while they
    # boot); "in_order": each started and ready before the next (a broker whose nodes race at first boot).
    start: str = "together"

    @property
    def declared(self) -> bool:
        return bool(self.steps or self.ready or self.holding or self.start != "together")

    def to_dict(self) -> dict[str, Any]:
        if not self.declared:
            return {}
        return {"steps": [list(step) for step in self.steps], "ready": list(self.ready),
                "ready_timeout_s": self.ready_timeout_s, "holding": list(self.holding), "start": self.start}


def read_nodes(s: Section, raw: Any) -> tuple[NodeSpec, ...]:
    """``[[target.nodes]]``: each table checked, names unique, explicit (host, port) pairs unique."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or not raw or not all(isinstance(entry, dict) for entry in raw):
        raise s.fail("nodes", raw if not isinstance(raw, list) else "[...]",
                     "must be an array of tables, one [[target.nodes]] per node (name = \"...\" at least)")
    if len(raw) > MAX_NODES:
        raise s.fail("nodes", f"[{len(raw)} nodes]", f"at most {MAX_NODES} nodes")
    nodes: list[NodeSpec] = []
    for index, entry in enumerate(raw, start=1):
        node_section = type(s)(s.source, "target.nodes", entry, label=f"[[target.nodes]] #{index}")
        nodes.append(_read_node(node_section))
    seen: dict[str, int] = {}
    for index, node in enumerate(nodes, start=1):
        if node.name in seen:
            raise s.error(f"{s.source}: [[target.nodes]] #{index} name = {node.name!r}: duplicate node name "
                          f"(node #{seen[node.name]} is also called that); every node needs its own name")
        seen[node.name] = index
    endpoints: dict[tuple[str, int], str] = {}
    for index, node in enumerate(nodes, start=1):
        # Without an explicit host every node gets its own 127.0.0.x inside the run's namespace, so the same
        # port on all of them is the usual case; only the same port on the same declared host collides.
        if not (node.host and node.port):
            continue
        key = (node.host, node.port)
        if key in endpoints:
            raise s.error(f"{s.source}: [[target.nodes]] #{index} port = {node.port}: duplicate address "
                          f"{node.host}:{node.port} (node {endpoints[key]!r} listens there too); give each node its "
                          "own port or host")
        endpoints[key] = node.name
    if not any(node.role == BROKER for node in nodes):
        raise s.fail("nodes", [node.name for node in nodes], "no node has role \"broker\": at least one node "
                     "must be an MQTT listener the clients connect to")
    return tuple(nodes)


def _read_node(s: Section) -> NodeSpec:
    name = read_name(s, "", what="the node's log file and directories", required=True)
    host = read_host(s)
    env = read_env(s)
    files = read_files(s, written_to="the node's {conf_dir}")
    timeout = s._get("ready_timeout_s", None, False)
    node = NodeSpec(
        name=name,
        role=s.string("role", BROKER, choices=NODE_ROLES),
        host=host,
        port=s.integer("port", 0, minimum=0, maximum=65535),
        start=s.strings("start"),
        stop=s.strings("stop"),
        kill=s.strings("kill"),
        env=env,
        files=files,
        ready=s.string("ready", "", choices=("",) + READY_CHECKS),
        ready_timeout_s=None if timeout is None else s.number("ready_timeout_s", 10.0, above=0.0, maximum=600.0),
    )
    s.finish()
    return node


def read_formation(s: Section, raw: Any, nodes: tuple[NodeSpec, ...]) -> FormationSpec:
    if raw is None:
        return FormationSpec()
    f = type(s)(s.source, "target.formation", raw)
    steps_raw = f._get("steps", [], False)
    if not isinstance(steps_raw, list) or not all(
            isinstance(step, list) and step and all(isinstance(a, str) for a in step) for step in steps_raw):
        raise f.fail("steps", steps_raw, "must be a list of argv lists, e.g. [[\"rabbitmqctl\", \"-n\", "
                     "\"rabbit@{nodes[rabbit2].host}\", \"join_cluster\", ...]]")
    spec = FormationSpec(
        steps=tuple(tuple(step) for step in steps_raw),
        ready=f.strings("ready"),
        ready_timeout_s=f.number("ready_timeout_s", FormationSpec.ready_timeout_s, above=0.0, maximum=1800.0),
        holding=f.strings("holding"),
        start=f.string("start", FormationSpec.start, choices=START_ORDERS),
    )
    f.finish()
    if spec.declared and len(nodes) < 2:
        raise s.fail("formation", "...", "forms a cluster of several nodes: declare them with [[target.nodes]] "
                     "(a one-node target has nothing to form)")
    if spec.holding and not any("{client}" in arg for arg in spec.holding):
        raise f.fail("holding", list(spec.holding), "must name the client with {client} (it prints the node "
                     "holding that client's session)")
    return spec


def minority_size(count: int) -> int:
    """The largest group that is not a majority (at least 1): 1 of 2 or 3, 2 of 4 or 5."""
    return max(1, (count - 1) // 2)


def majority_size(count: int) -> int:
    return count // 2 + 1


DATA_DIR_PLACEHOLDER = "{data_dir}"


def harness_data_dirs(node_specs: Any, config_text: str = "") -> dict[str, bool]:
    """Per node of an external target (contracts/target_nodes.py NodeSpec): whether the broker keeps its data in
    the directory the harness gives it, i.e. whether ``{data_dir}`` appears in what the node is started with
    (its start argv, env values, its files and the target's config_text, all filled in per node), or
    ``{nodes[NAME].data_dir}`` anywhere in the target.  Only such a directory can be put on lazyfs before the
    node starts; a broker that stores elsewhere (its packaged default, /var/lib/...) would write past it."""
    texts = {spec.name: [*spec.start, *(value for _key, value in spec.env), *(text for _name, text in spec.files),
                         config_text] for spec in node_specs}
    everything = "\n".join(text for node_texts in texts.values() for text in node_texts)
    return {name: any(DATA_DIR_PLACEHOLDER in text for text in node_texts)
            or f"{{nodes[{name}].data_dir}}" in everything
            for name, node_texts in texts.items()}
