"""Client faults: described and validated here, played by the executor (it owns the MQTT clients).

The nemesis never touches a client socket.  A client fault's slot means:
- at its start offset the executor drops the connection(s) — ``abrupt``: close the socket without a
  DISCONNECT packet; ``clean``: send DISCONNECT, then close;
- at its end offset, when ``reconnect`` is true, it reconnects them with ``clean_start`` to ``node``
  ("same" node, an "other" node than before, or "broker:N").
The executor records the evidence (the client really lost its socket: disconnect row with abrupt/initiator,
the broker saw it go) as fault_evidence rows, like the nemesis does for its own faults.
"""

from __future__ import annotations

import random
from typing import Any

from faults.base import Check, FaultNotApplicable, KindInfo, Param, register

_MODES = ("abrupt", "clean")


def node_choice_error(value: Any) -> str | None:
    if value in ("same", "other", "random"):
        return None
    if isinstance(value, str) and value.startswith("broker:") and value[7:].isdigit() and int(value[7:]) >= 1:
        return None
    return "expected 'same', 'other', 'random' or 'broker:N' (N >= 1)"


def sessions_error(value: Any) -> str | None:
    if value == "all" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return None
    return "expected 'all' or a number of sessions >= 1"


_MODE = Param("mode", str, "abrupt", "abrupt: close the socket without DISCONNECT; clean: DISCONNECT first",
              choices=_MODES)
_RECONNECT = Param("reconnect", bool, True, "reconnect at the fault's end offset")
_CLEAN_START = Param("clean_start", bool, False, "clean start flag on the reconnect (true drops the session)")
_NODE = Param("node", str, "same", "which broker node to reconnect to", check=node_choice_error)

register(KindInfo(
    name="client_flap", category="client", target="client", factory=None,
    description="drop one client's connection (abrupt or clean) at start; reconnect at end (executor plays it)",
    params=(_MODE, _RECONNECT, _CLEAN_START, _NODE),
))
register(KindInfo(
    name="client_reconnect_storm", category="client", target="none", factory=None,
    description="drop many subscriber sessions at once at start; reconnect them all at once at end",
    params=(Param("sessions", (str, int), "all", "'all' subscribers or how many (seeded choice)",
                  check=sessions_error),
            _MODE, _CLEAN_START, Param("node", str, "random", "which broker node each reconnects to",
                                       check=node_choice_error)),
))


# --- helpers for the executor, so every player resolves a client fault the same way ------------------


def storm_sessions(spec_params: dict[str, Any], subscriber_ids: list[str], rng: random.Random) -> list[str]:
    """The subscribers a reconnect storm drops: all, or ``sessions`` of them (seeded, in a stable order)."""
    wanted = spec_params.get("sessions", "all")
    ordered = sorted(subscriber_ids)
    if wanted == "all" or wanted >= len(ordered):
        return ordered
    return sorted(rng.sample(ordered, wanted))


def reconnect_node(choice: str, current: int, node_count: int, rng: random.Random) -> int:
    """The broker node index (0-based) a client reconnects to: "same", "other" (the next one round the
    ring; the same when there is only one node), "random" (seeded) or "broker:N" (N is 1-based)."""
    if node_count < 1:
        raise FaultNotApplicable("no broker node to reconnect to")
    if choice == "same":
        return current
    if choice == "other":
        return (current + 1) % node_count
    if choice == "random":
        return rng.randrange(node_count)
    index = int(choice.split(":", 1)[1]) - 1
    if index >= node_count:
        raise FaultNotApplicable(f"reconnect to {choice}: the topology has {node_count} broker node(s)")
    return index


def socket_lost_check(client_id: str, lost: bool, **observed: Any) -> Check:
    """The evidence a client fault bit at apply: the client's socket really closed (abrupt or clean)."""
    return Check("client socket closed", {"client": client_id, **observed}, lost)


def reconnected_check(client_id: str, connected: bool, **observed: Any) -> Check:
    """The evidence at heal: the reconnect got its CONNACK (observed: session_present, node, ...)."""
    return Check("client reconnected", {"client": client_id, **observed}, connected)
