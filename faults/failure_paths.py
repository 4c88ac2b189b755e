"""Faults that reach the broker's failure paths: a write stall on one Redis master while reads
still work, a Redis outage longer than the broker's retry budget, a Kafka outage while a save is in flight.

The shipped Redis faults (kill, pause, failover: 2-4 s) end before a broker gives up retrying, and a kill
of the whole cluster also fails the broker's lease check, so the "give up and commit anyway" path was
never reached.  These kinds aim at those paths and record what they saw there:

- ``redis_write_stall``: ``CLIENT PAUSE <ms> WRITE`` (Redis >= 6.2) on a master: writes and every script
  (the broker's save, its lease renewals) block, reads still answer.  Evidence: a probe write blocks and
  a probe read answers on that master; at heal ``CLIENT UNPAUSE``, the probe write completes, and the
  broker's log lines written meanwhile.
- ``redis_outage``: ``scope = "master"``: the broker nodes' TCP packets to one master are answered with a
  reset (nftables ``reject with tcp reset``, counted), so every save to that master's slots fails at once
  while the cluster stays healthy (no failover) and the other masters -- the lease keys' included, unless
  the target holds them -- still answer: the broker retries, runs out of retries and, with the skip
  strategy, gives up (``giving up ... committing anyway``).  ``scope = "cluster"``: every Redis node is
  stopped (SIGSTOP): a full outage; saves and the lease check before the commit fail alike.  Evidence: the
  reject counters / every node in state T, and the broker's failure lines during the outage.
- ``kafka_outage_during_save``: holds the saves to one master (``CLIENT PAUSE WRITE``) until one is
  blocked in flight, then kills (or stops, pauses) the Kafka node and releases the saves: they complete
  while Kafka is down, so the commit after them fails.  Evidence: the blocked save scripts seen in CLIENT
  LIST at the kill, the Kafka process gone, and at heal Kafka back plus the broker's commit failures.

Broker log lines are an observation, read from every broker node's log between apply and heal (the file
offsets at apply); a fault whose effect shows only there says so in its checks.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import redis
from redis.crc import key_slot

from contracts.topology import Topology
from faults import probes
from faults.base import (
    Check,
    Evidence,
    FaultContext,
    FaultNotApplicable,
    FaultSpec,
    KindInfo,
    Param,
    register,
)
from faults.redis_cluster_view import ClusterEntry, ClusterView, connect, query, wait_until
from faults.selectors import resolve_node

# The reference broker's log lines on its failure paths (reference_broker/kafka_path.py, connection.py).
BROKER_FAILURE_PATTERNS: dict[str, str] = {
    "processing_failed": r"processing failed \(attempt (\d+)\)",
    "gave_up": r"giving up on \d+ records after \d+ attempts",
    "committing_anyway": r"committing anyway",
    "lease_check_failed": r"lease check before commit failed",
    "commit_failed": r"commit failed \(attempt \d+\)",
    "poll_failed": r"poll failed",
    "delivery_read_failed": r"delivery read failed",
    "lease_tick_failed": r"lease tick failed",
    "slow_batch": r"slow batch of \d+ records",
    # aiokafka's own lines when the Kafka node is gone (the commit then waits or fails)
    "kafka_unreachable": r"Unable connect to node|Group Coordinator Request failed|OffsetCommitRequest",
}
MAX_SAMPLE_LINES = 5


# --- observations ----------------------------------------------------------------------------------


class BrokerLogWatch:
    """Offsets of every broker node's log at the start; ``since()`` counts the failure lines written after."""

    def __init__(self, topology: Topology) -> None:
        self.offsets: dict[str, tuple[Path, int]] = {}
        for node in getattr(topology, "brokers", []) or []:
            path = getattr(node, "log_path", None)
            if path is None:
                continue
            path = Path(path)
            self.offsets[node.name] = (path, path.stat().st_size if path.exists() else 0)

    def lines_since(self) -> list[tuple[str, str]]:
        """(node name, line) of every line each broker node's log got since the watch began, node by node."""
        out: list[tuple[str, str]] = []
        for name, (path, offset) in sorted(self.offsets.items()):
            try:
                with path.open("rb") as log:
                    log.seek(offset)
                    text = log.read().decode("utf-8", "replace")
            except OSError:
                continue
            out += [(name, line) for line in text.splitlines()]
        return out

    def since(self) -> dict[str, Any]:
        """{"counts": {pattern: n}, "max_attempt": k, "lines": [a few], "nodes": [...]} over every node."""
        counts = dict.fromkeys(BROKER_FAILURE_PATTERNS, 0)
        sample: list[str] = []
        max_attempt = 0
        for name, line in self.lines_since():
            hit = False
            for pattern_name, pattern in BROKER_FAILURE_PATTERNS.items():
                match = re.search(pattern, line)
                if match:
                    counts[pattern_name] += 1
                    hit = True
                    if pattern_name == "processing_failed":
                        max_attempt = max(max_attempt, int(match.group(1)))
            if hit and len(sample) < MAX_SAMPLE_LINES:
                sample.append(f"{name}: {line[:300]}")
        return {"counts": {k: v for k, v in counts.items() if v}, "max_attempt": max_attempt, "lines": sample,
                "nodes": sorted(self.offsets)}


def broker_check(watch: BrokerLogWatch, wanted: tuple[str, ...], what: str) -> Check:
    """ok when the broker logged at least one of the ``wanted`` failure lines since the watch began."""
    seen = watch.since()
    return Check(what, {**seen, "wanted_any_of": list(wanted)}, any(seen["counts"].get(w) for w in wanted))


def probe_key(entry: ClusterEntry) -> str:
    """A key in one of ``entry``'s slots (the probe writes must go to the stalled master)."""
    for index in range(100_000):
        key = f"ordeal:probe:{index}"
        if entry.owns_slot(key_slot(key.encode())):
            return key
    raise FaultNotApplicable(f"no probe key found for the slots of {entry.address}")


def _timed(host: str, port: int, timeout_s: float, *command: Any) -> tuple[str, Any]:
    """('answered', reply) | ('blocked', None) on a timeout | ('error', text).  Sent once (``connect``): with
    redis-py's default retries a write probe on a paused master took ~10 s instead of ``timeout_s`` and held
    the nemesis past the fault's planned heal (redis-write-stall seed 101: f01 healed 6.6 s late)."""
    client = connect(host, port, timeout_s)
    try:
        return "answered", client.execute_command(*command)
    except redis.TimeoutError:
        return "blocked", None
    except (redis.RedisError, OSError) as error:
        return "error", f"{type(error).__name__}: {error}"
    finally:
        client.close()


def _master(ctx: FaultContext, spec: FaultSpec) -> tuple[Any, ClusterEntry]:
    node = resolve_node(ctx.topology, spec.target, ctx.rng_for(spec.id), ctx.broker_key_prefix)
    entry = ClusterView.read(ctx.topology).entry_for(node)
    if entry is None or not (entry.is_master and entry.slots):
        raise FaultNotApplicable(f"fault {spec.id} ({spec.kind}): {node.name} is not a Redis master serving "
                                 "slots (a replica stores nothing the broker writes); target a master, e.g. "
                                 "redis-master-of:{subscriber}")
    return node, entry


def _require_pause_write(spec: FaultSpec, node: Any) -> str:
    try:
        version = str(query(node.host, node.port, "INFO", "server").get("redis_version", ""))
    except (redis.RedisError, OSError) as error:
        raise FaultNotApplicable(f"fault {spec.id}: INFO server on {node.name} failed: {error}") from None
    parts = tuple(int(p) for p in re.findall(r"\d+", version)[:2])
    if parts < (6, 2):
        raise FaultNotApplicable(f"fault {spec.id} ({spec.kind}): {node.name} runs Redis {version}; "
                                 "CLIENT PAUSE ... WRITE needs 6.2 or newer")
    return version


def _paused_writers(node: Any) -> list[str]:
    """CLIENT LIST entries blocked (flag b) in a script: the saves held by the pause.  Plain writes (a session
    record's HSET) do not count: kafka-outage-save seed 1's second fault took one for a save.  (On the master
    of the {ordeal} keys a held script may be a lease renewal: CLIENT LIST shows no arguments.)"""
    try:
        listing = query(node.host, node.port, "CLIENT", "LIST")
    except (redis.RedisError, OSError):
        return []
    rows = listing if isinstance(listing, list) else [
        dict(field.split("=", 1) for field in line.split() if "=" in field) for line in str(listing).splitlines()]
    return [f"{row.get('addr')} {row.get('cmd')}" for row in rows
            if "b" in str(row.get("flags", "")) and str(row.get("cmd", "")).split("|")[0] in ("evalsha", "eval", "fcall")]


def release_client_pauses(topology: Topology) -> list[str]:
    """heal_all: CLIENT UNPAUSE on every running Redis node (a write stall whose heal never ran would
    otherwise hold writes until its own max_ms).  Best effort; returns the nodes that answered OK."""
    released = []
    for node in getattr(topology, "redis_nodes", []) or []:
        if not node.is_alive() or probes.is_stopped(node.pid):
            continue
        try:
            query(node.host, node.port, "CLIENT", "UNPAUSE")
            released.append(node.name)
        except (redis.RedisError, OSError):
            continue
    return released


# --- redis_write_stall ------------------------------------------------------------------------------


class WriteStallFault:
    def __init__(self, spec: FaultSpec) -> None:
        self.spec = spec
        self.node: Any = None
        self.key = ""
        self.watch: BrokerLogWatch | None = None
        self.started = 0.0

    def apply(self, ctx: FaultContext) -> Evidence:
        params = self.spec.params
        self.node, entry = _master(ctx, self.spec)
        version = _require_pause_write(self.spec, self.node)
        self.key = probe_key(entry)
        self.watch = BrokerLogWatch(ctx.topology)
        query(self.node.host, self.node.port, "CLIENT", "PAUSE", int(params["max_ms"]), "WRITE")
        self.started = time.monotonic()
        ctx.note_node_event(self.node.name, "client_pause_write", fault_id=self.spec.id, max_ms=params["max_ms"])
        timeout = float(params["probe_timeout_s"])
        write, _ = _timed(self.node.host, self.node.port, timeout, "SET", self.key, self.spec.id)
        read, reply = _timed(self.node.host, self.node.port, timeout, "GET", self.key)
        return Evidence.of(
            Check("write blocked", {"node": self.node.name, "key": self.key, "command": "SET", "outcome": write,
                                    "timeout_s": timeout, "redis_version": version}, write == "blocked"),
            Check("read answers", {"node": self.node.name, "key": self.key, "command": "GET", "outcome": read,
                                   "reply": reply}, read == "answered"),
        )

    def heal(self, ctx: FaultContext) -> Evidence:
        try:
            query(self.node.host, self.node.port, "CLIENT", "UNPAUSE")
        except (redis.RedisError, OSError) as error:
            return Evidence.of(Check("writes released", {"node": self.node.name, "error": str(error)}, False))
        ctx.note_node_event(self.node.name, "client_unpause", fault_id=self.spec.id)
        stalled_s = round(time.monotonic() - self.started, 3)
        write, _ = _timed(self.node.host, self.node.port, 2.0, "SET", self.key, "healed")
        checks = [Check("writes released", {"node": self.node.name, "command": "SET", "outcome": write,
                                            "stalled_s": stalled_s}, write == "answered")]
        # What the broker saw: an observation, not a condition (a stall shorter than the broker's timeouts
        # shows only as slow batches; a quiet slot as nothing).
        checks.append(Check("broker log during the stall", self.watch.since() if self.watch else {}, True))
        return Evidence.of(*checks)


# --- redis_outage -----------------------------------------------------------------------------------


class OutageFault:
    def __init__(self, spec: FaultSpec) -> None:
        self.spec = spec
        self.drop: Any = None
        self.paused: list[Any] = []
        self.watch: BrokerLogWatch | None = None
        self.started = 0.0
        self.node: Any = None

    def apply(self, ctx: FaultContext) -> Evidence:
        self.watch = BrokerLogWatch(ctx.topology)
        if self.spec.params["scope"] == "cluster":
            return self._stop_cluster(ctx)
        from faults.network import RejectFault

        self.node, entry = _master(ctx, self.spec)
        view = ClusterView.read(ctx.topology)
        lease_master = view.master_of_key(ctx.broker_key_prefix + "{ordeal}:lease")
        moved_from = None
        if lease_master.node_id == entry.node_id and self.spec.params["spare_lease_master"]:
            # Why move: with the lease keys unreachable too the broker stops consuming (its leases lapse) and
            # no commit happens at all -- the outage would never reach "retries exhausted, commit anyway".
            others = sorted((m for m in view.masters() if m.node_id != lease_master.node_id), key=lambda m: m.address)
            if others:
                moved_from, entry = self.node.name, ctx.rng_for(self.spec.id).choice(others)
                self.node = view.handle(ctx.topology, entry)
        self.drop = RejectFault(FaultSpec(self.spec.id, self.spec.kind, None,
                                          {"src": "broker", "dst": f"node:{self.node.name}"}))
        evidence = self.drop.apply(ctx)
        self.started = time.monotonic()
        ctx.note_node_event(self.node.name, "unreachable_from_brokers", fault_id=self.spec.id)
        # An observation, not a condition: when the target also holds the {ordeal} lease keys the commit's
        # lease check fails too and the broker commits nothing (the plan picks the target; a run with several
        # subscribers on several masters reaches "commit anyway" through the others).
        return evidence.plus(Check("lease keys' master", {
            "lease_keys_master": lease_master.address, "target": f"{self.node.host}:{self.node.port}",
            "moved_from": moved_from, "lease_check_reachable": lease_master.node_id != entry.node_id}, True))

    def _stop_cluster(self, ctx: FaultContext) -> Evidence:
        nodes = [n for n in getattr(ctx.topology, "redis_nodes", []) or [] if n.is_alive()]
        if not nodes:
            raise FaultNotApplicable(f"fault {self.spec.id}: no running Redis node")
        for node in nodes:
            node.pause()
            self.paused.append(node)
            ctx.note_node_event(node.name, "pause", fault_id=self.spec.id, pid=node.pid)
        self.started = time.monotonic()
        stopped, observed, waited = wait_until(
            lambda: (all(probes.is_stopped(n.pid) for n in nodes), {n.name: probes.proc_state(n.pid) for n in nodes}),
            2.0, interval_s=0.01)
        return Evidence.of(Check("every Redis node stopped (state T)", {**observed, "waited_s": waited}, stopped))

    def heal(self, ctx: FaultContext) -> Evidence:
        lasted_s = round(time.monotonic() - self.started, 3)
        if self.spec.params["scope"] == "cluster":
            for node in self.paused:
                node.resume()
                ctx.note_node_event(node.name, "resume", fault_id=self.spec.id, pid=node.pid)

            def cluster_ok() -> tuple[bool, dict]:
                states = {}
                for node in self.paused:
                    try:
                        info = query(node.host, node.port, "CLUSTER", "INFO")
                        states[node.name] = info.get("cluster_state") if isinstance(info, dict) else (
                            "ok" if "cluster_state:ok" in str(info) else "fail")
                    except (redis.RedisError, OSError) as error:
                        states[node.name] = f"error: {error}"
                return all(state == "ok" for state in states.values()), states

            ok, observed, waited = wait_until(cluster_ok, ctx.ready_timeout_s, interval_s=0.2)
            checks = [Check("cluster ok again", {**observed, "waited_s": waited, "lasted_s": lasted_s}, ok)]
        else:
            checks = list(self.drop.heal(ctx).checks)
            checks.append(Check("outage length", {"lasted_s": lasted_s}, True))
        wanted = ("processing_failed", "gave_up", "lease_check_failed", "delivery_read_failed", "poll_failed",
                  "lease_tick_failed")
        checks.append(broker_check(self.watch, wanted, "broker met the outage"))
        return Evidence.of(*checks)


# --- kafka_outage_during_save -------------------------------------------------------------------------


class KafkaOutageDuringSave:
    def __init__(self, spec: FaultSpec) -> None:
        self.spec = spec
        self.kafka: Any = None
        self.master: Any = None
        self.pid_before: int | None = None
        self.watch: BrokerLogWatch | None = None

    def apply(self, ctx: FaultContext) -> Evidence:
        params = self.spec.params
        rng = ctx.rng_for(self.spec.id)
        self.kafka = resolve_node(ctx.topology, self.spec.target, rng, ctx.broker_key_prefix)
        if self.kafka.role != "kafka":
            raise FaultNotApplicable(f"fault {self.spec.id}: target {self.kafka.name} is a {self.kafka.role} "
                                     "node; this fault takes the Kafka node down (target 'kafka')")
        if not self.kafka.is_alive():
            raise FaultNotApplicable(f"fault {self.spec.id}: {self.kafka.name} is not running")
        if params["mode"] in ("kill", "stop"):
            config = getattr(ctx.topology, "config", None)
            why = config.destructive_kill_loses_log("kafka") if hasattr(config, "destructive_kill_loses_log") else ""
            if why:
                raise FaultNotApplicable(f"fault {self.spec.id} ({params['mode']} of {self.kafka.name}): {why}; "
                                         "use mode = \"pause\" on this storage")
        stall = FaultSpec(self.spec.id, "redis_write_stall", params["stall_master"], {})
        self.master, _entry = _master(ctx, stall)
        _require_pause_write(self.spec, self.master)
        self.watch = BrokerLogWatch(ctx.topology)
        hold_ms = int((float(params["hold_max_s"]) + 5.0) * 1000)  # a cap: released below, or by Redis itself
        query(self.master.host, self.master.port, "CLIENT", "PAUSE", hold_ms, "WRITE")
        ctx.note_node_event(self.master.name, "client_pause_write", fault_id=self.spec.id, max_ms=hold_ms)
        try:
            # Why wait for a blocked writer: "during a save" means a save script is in flight when Kafka goes.
            held, observed, waited = wait_until(lambda: (bool(w := _paused_writers(self.master)), {"blocked": w}),
                                                float(params["hold_max_s"]), interval_s=0.05)
            self.pid_before = self.kafka.pid
            mode = params["mode"]
            if mode == "kill":
                self.kafka.kill()
            elif mode == "stop":
                self.kafka.stop(timeout=5.0)
            else:
                self.kafka.pause()
            ctx.note_node_event(self.kafka.name, mode, fault_id=self.spec.id, pid=self.pid_before)
            down_ok, down = self._down(mode)
        finally:
            query(self.master.host, self.master.port, "CLIENT", "UNPAUSE")
            ctx.note_node_event(self.master.name, "client_unpause", fault_id=self.spec.id)
        return Evidence.of(
            Check("a save was in flight", {"master": self.master.name, **observed, "waited_s": waited}, held),
            Check(f"kafka {mode}", {"node": self.kafka.name, "pid": self.pid_before, **down}, down_ok),
        )

    def _down(self, mode: str) -> tuple[bool, dict]:
        if mode == "pause":
            ok, observed, waited = wait_until(lambda: (probes.is_stopped(self.pid_before),
                                                       {"state": probes.proc_state(self.pid_before)}), 2.0, 0.01)
            return ok, {**observed, "waited_s": waited}
        ok, observed, waited = wait_until(
            lambda: (probes.pid_gone(self.pid_before) and probes.port_state(self.kafka.host, self.kafka.port)
                     == "refuses", {"port": probes.port_state(self.kafka.host, self.kafka.port)}), 5.0, 0.02)
        return ok, {**observed, "waited_s": waited}

    def heal(self, ctx: FaultContext) -> Evidence:
        if self.spec.params["mode"] == "pause":
            self.kafka.resume()
            ctx.note_node_event(self.kafka.name, "resume", fault_id=self.spec.id, pid=self.pid_before)
        elif not self.kafka.is_alive():
            self.kafka.start()
            ctx.note_node_event(self.kafka.name, "start", fault_id=self.spec.id, pid=self.kafka.pid)
        self.kafka.wait_ready(ctx.ready_timeout_s)
        state = probes.port_state(self.kafka.host, self.kafka.port)
        return Evidence.of(
            Check("kafka back", {"node": self.kafka.name, "pid": self.kafka.pid, "port": state}, state == "accepts"),
            broker_check(self.watch, ("commit_failed", "poll_failed", "processing_failed", "kafka_unreachable"),
                         "broker met the outage after the save"),
        )


def _selector_error(value: Any) -> str | None:
    from faults.base import FaultSpecError
    from faults.selectors import SELECTOR_HELP, parse_selector

    try:
        parse_selector(value)
    except FaultSpecError:
        return f"expected a node selector: {SELECTOR_HELP}"
    return None


register(KindInfo(
    name="redis_write_stall", category="redis", target="node", factory=WriteStallFault,
    description="CLIENT PAUSE WRITE on a Redis master: writes and scripts block, reads answer; heal unpauses",
    params=(Param("max_ms", int, 120_000, "the pause's own limit (a safety cap: heal unpauses)", min=100,
                  max=3_600_000),
            Param("probe_timeout_s", float, 0.5, "a probe write blocked this long counts as stalled", min=0.05,
                  max=10.0)),
))
register(KindInfo(
    name="redis_outage", category="redis", target="node", factory=OutageFault,
    description="Redis unavailable to the brokers: one master's connections reset (scope master), or every "
                "node stopped (scope cluster); meant to outlast the broker's retries",
    params=(Param("scope", str, "master", "master: the brokers' TCP to the target master is reset, the cluster "
                                          "stays up; cluster: every Redis node SIGSTOPped",
                  choices=("master", "cluster")),
            Param("spare_lease_master", bool, True, "scope master: when the target also holds the broker's "
                  "lease keys ({ordeal}), reset another master instead (seeded), so the lease check stays up")),
))
register(KindInfo(
    name="kafka_outage_during_save", category="process", target="node", factory=KafkaOutageDuringSave,
    description="hold a save to a Redis master in flight (CLIENT PAUSE WRITE), take Kafka down, release the "
                "save: its commit meets the outage; heal brings Kafka back",
    params=(Param("mode", str, "kill", "how Kafka goes down", choices=("kill", "stop", "pause")),
            Param("stall_master", str, "redis-random-master",
                  "the master whose saves are held: a node selector (redis-master-of:{subscriber} in a "
                  "scenario)", check=_selector_error),
            Param("hold_max_s", float, 5.0, "wait at most this long for a save to be in flight", min=0.1,
                  max=60.0)),
))
