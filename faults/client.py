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

from typing import Any

from faults.base import KindInfo, Param, register

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
