"""From counts and witnesses to a verdict per invariant, and from verdicts to the exit code."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from contracts.exit_codes import EXIT_FAIL, EXIT_PASS, EXIT_UNKNOWN
from contracts.invariants import Invariant

PASS, FAIL, UNKNOWN, NOT_APPLICABLE = "pass", "fail", "unknown", "not_applicable"
# Something was found that the target never promised to prevent (its declaration): neither a pass nor a
# violation, shown with its count; it does not change the exit code.
ALLOWED = "allowed"
VERDICTS = (PASS, FAIL, UNKNOWN, NOT_APPLICABLE, ALLOWED)


@dataclass(frozen=True)
class InvariantResult:
    id: str
    title: str
    verdict: str
    count: int  # violations found (for reported-only invariants: the reported amount)
    witnesses: tuple[dict, ...] = ()  # {"text": plain words, "data": the raw witness}
    reason: str | None = None  # why unknown / not applicable / allowed
    allowed: bool = False  # violations found but the scenario allows them
    reported_only: bool = False
    details: dict[str, Any] = field(default_factory=dict)
    # What the verdict judged: how many acknowledged messages (owed, lost, delivered) or sessions it covers.
    covers: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["witnesses"] = list(self.witnesses)
        return data


def decide(invariant: Invariant, count: int, *, allowed: tuple[str, ...], fatal: tuple[str, ...],
           incomplete: tuple[str, ...], unknown_reason: str | None, white_box: bool,
           queue_policy: str = "drop_oldest", allowance: str = "", history_version: int = 2,
           mqtt5: bool = True) -> tuple[str, str | None, bool]:
    """(verdict, reason, allowed) for one invariant.  Unknown is never a pass.  ``queue_policy``: the target's
    declared queue policy (a limits rule for another policy is not applicable); ``allowance``: why the losses
    a ``declared_allowance`` invariant counts were never promised (the declaration, in words); ``history_version``:
    the history's schema version (a ``needs_v2`` rule cannot be decided on version 1); ``mqtt5``: whether the run
    had an MQTT 5 connection at all (an ``mqtt5_only`` rule has nothing to judge without one)."""
    if fatal:
        return UNKNOWN, "; ".join(fatal), False
    if invariant.white_box and not white_box:
        return NOT_APPLICABLE, "black-box target (target.kind = 'external'): no white-box state to inspect", False
    if invariant.queue_policies and queue_policy not in invariant.queue_policies:
        why = ("the target declares no queue limit (queue_policy = \"none\")" if queue_policy == "none"
               else f"the target declares queue_policy = {queue_policy!r}")
        return NOT_APPLICABLE, f"{why}; this rule is for {' / '.join(invariant.queue_policies)}", False
    if invariant.mqtt5_only and not mqtt5:
        return NOT_APPLICABLE, "no client of this run connected with MQTT 5: the rule is about MQTT 5 packets", False
    if unknown_reason:
        return UNKNOWN, unknown_reason, False
    if invariant.needs_v2 and history_version < 2:
        return UNKNOWN, (f"the history is of schema version {history_version}, which records nothing this rule "
                         "reads (the QoS 2 flow steps, forwarded properties, packet sizes: version 2)"), False
    if invariant.reported_only:
        return PASS, "reported, never failing", False
    if invariant.declared_allowance:
        if count > 0:
            return ALLOWED, f"{count} counted, not promised: {allowance or 'the target does not promise it'}", True
        return PASS, None, False
    if count > 0:
        if invariant.id in allowed:
            return PASS, f"{count} violation(s), allowed by the scenario's checks.allowed", True
        if invariant.needs_complete_history and incomplete:
            return UNKNOWN, (f"{count} candidate violation(s), but the history is incomplete: "
                             + "; ".join(incomplete)), False
        return FAIL, None, False
    if invariant.needs_complete_history and incomplete:
        return UNKNOWN, "an absence proves nothing in an incomplete history: " + "; ".join(incomplete), False
    return PASS, None, False


def exit_code(results: list[InvariantResult] | tuple[InvariantResult, ...]) -> int:
    verdicts = {r.verdict for r in results}
    if FAIL in verdicts:
        return EXIT_FAIL
    if UNKNOWN in verdicts or not results:
        return EXIT_UNKNOWN
    return EXIT_PASS
