"""What the external-target tests read back from a run and assert alike (the clusters, the death watch)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from contracts.history_schema import Kind


def node_events(rows: list[dict]) -> list[tuple[str, str, dict]]:
    """(node, action, detail) of every node_event row, in history order."""
    return [(r["node"], (detail := json.loads(r["detail"] or "{}")).get("action"), detail)
            for r in rows if r["kind"] == Kind.NODE_EVENT]


def fault_rows(rows: list[dict]) -> list[dict]:
    """The nemesis' rows (start, evidence, heal, error), each with its detail parsed."""
    return [{**r, "detail": json.loads(r["detail"] or "{}")} for r in rows
            if r["kind"] in (Kind.FAULT_START, Kind.FAULT_EVIDENCE, Kind.FAULT_HEAL, Kind.FAULT_ERROR)]


def failing(run_dir: Path) -> list:
    """What a failed check found: each failing or unknown invariant with its count, reason and first witnesses."""
    report = json.loads((run_dir / "report.json").read_text())
    return [(i["id"], i["verdict"], i["count"], i.get("reason"), [w.get("text") for w in i.get("witnesses", [])[:3]])
            for i in report["invariants"] if i["verdict"] in ("fail", "unknown")]


def assert_formed_with_clients_on_every_node(run_dir: Path, rows: list[dict], nodes: set[str]) -> list[dict]:
    """Every node ready, the cluster formed at start, clients connected to every node, topology.json naming
    every broker on its own address.  Returns the connect rows."""
    events = node_events(rows)
    assert {node for node, action, _ in events if action == "ready"} == nodes
    formed = [detail for _node, action, detail in events if action == "formed"]
    assert formed and formed[0]["why"] == "start", events
    connects = [r for r in rows if r["kind"] == Kind.CONNECT]
    assert {r["node"] for r in connects} == nodes, "clients on every node"
    topology = json.loads((run_dir / "topology.json").read_text())
    assert set(topology["cluster"]["brokers"]) == nodes and len(set(topology["mqtt"].values())) == len(nodes)
    return connects


def assert_one_node_kill_bit_healed_and_re_formed(rows: list[dict], nodes: set[str]) -> dict[str, Any]:
    """The planned kill of one node: applied without error, proven (PID gone, port refusing), healed on that
    node, the cluster formed again after it came back, and no unplanned exit.  Returns the apply evidence."""
    faults = fault_rows(rows)
    assert not [f for f in faults if f["kind"] == Kind.FAULT_ERROR], faults
    evidence = [f for f in faults if f["kind"] == Kind.FAULT_EVIDENCE]
    apply, heal = evidence[0], evidence[-1]
    assert apply["bit"] and apply["node"] in nodes, apply
    assert {c["what"] for c in apply["detail"]["checks"]} >= {"pid gone", "port refuses"}, apply
    assert heal["bit"] and heal["detail"]["stage"] == "heal" and heal["node"] == apply["node"], heal
    events = node_events(rows)
    victim = apply["node"]
    assert (victim, "kill") in [(n, a) for n, a, _ in events]
    back = [detail for _n, action, detail in events if action == "formed" and detail["why"] == f"{victim} back"]
    assert back, f"the cluster re-formed after {victim} came back: {events}"
    assert not [e for e in events if e[1] == "exited"], "a planned kill is no unplanned exit"
    return apply


def sessions_taken_over(connects: list[dict]) -> dict[str, list[tuple[str, bool]]]:
    """Clients whose reconnect on another node found their session (session present there): client -> its
    (node, session present) connects."""
    seen: dict[str, list[tuple[str, bool]]] = {}
    for row in connects:
        seen.setdefault(row["client"], []).append((row["node"], row["session_present"]))
    return {client: steps for client, steps in seen.items()
            if any(b[0] != a[0] and b[1] for a, b in zip(steps, steps[1:], strict=False))}
