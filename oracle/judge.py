"""The oracle's verdicts: per covered invariant, its count and items (oracle/rules.py) and the verdict they make
with what the run declares (docs/invariants.md: the opening, "How an incomplete or broken history is
decided", and the flags of contracts/invariants.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from contracts.invariants import BY_ID, Invariant
from oracle.model import Model, build, phase_problems
from oracle.rules import RULES, Item
from oracle.run import Run, load
from oracle.topics import shared

PASS, FAIL, UNKNOWN, NOT_APPLICABLE, ALLOWED = "pass", "fail", "unknown", "not_applicable", "allowed"
# The invariants with a rule here.  Not judged by the oracle: the log oracle's two (another table, judged by
# the scenario's declared patterns), health.unresponsive (which faults cover a node needs the fault catalog's
# kinds, above the contracts), meta.checker_error (about the checker itself), and the Will and retained rules
# (will.*, retained.not_last: the generated histories carry no Will and no retained publish, so the checkers
# answer not applicable there; tests/checkers/test_will_retained_rules.py plants them).  Their traffic is read
# as the checkers read it: the Will flow is no published message (model.py), a retained copy no forward of its
# stream (order.out_of_order), so the catalog's Will and retained cases pass every rule judged here.
COVERED: tuple[str, ...] = (*RULES, "meta.history_complete")


@dataclass(frozen=True)
class Verdict:
    invariant: str
    verdict: str
    count: int
    items: tuple[Item, ...] = ()
    reason: str = ""


@dataclass(frozen=True)
class Judgement:
    run_dir: Path
    verdicts: dict[str, Verdict] = field(default_factory=dict)


def judge(run_dir: str | Path, rules=None) -> Judgement:
    """The oracle's verdict on every covered invariant of the run in ``run_dir``.  ``rules``: a replacement
    for some of oracle/rules.py RULES (a test plants a broken rule this way)."""
    return judge_loaded(load(run_dir), rules)


def judge_loaded(run: Run, rules=None) -> Judgement:
    rules = {**RULES, **(rules or {})}
    if run.fatal:
        why = "; ".join(run.fatal)
        return Judgement(run.directory, {i: Verdict(i, UNKNOWN, 0, (), why) for i in COVERED})
    m = build(run)
    incomplete = [*run.incomplete, *phase_problems(m)]
    unknown = _unknown_reasons(m)
    verdicts = {}
    for invariant_id in COVERED:
        items = tuple(rules[invariant_id](m)) if invariant_id in rules else ()
        verdict, reason = decide(BY_ID[invariant_id], len(items), m, incomplete, unknown.get(invariant_id))
        verdicts[invariant_id] = Verdict(invariant_id, verdict, len(items), items, reason)
    return Judgement(run.directory, verdicts)


def _unknown_reasons(m: Model) -> dict[str, str]:
    reasons: dict[str, str] = {}
    unproven = [f.fault_id for f in m.faults if f.errors or f.bit is not True]
    if unproven:
        reasons["meta.fault_bit"] = f"faults not applied or not proven to bite: {', '.join(unproven)}"
    if m.declared.white_box and not m.snapshots:
        for i in ("whitebox.orphan_payloads", "whitebox.dangling_refs", "whitebox.last_packet_id_behind"):
            reasons[i] = "a reference target without session snapshots"
    return reasons


def decide(invariant: Invariant, count: int, m: Model, incomplete: list[str], unknown: str | None) -> tuple[str, str]:
    """Unknown is never a pass; an absence proves nothing in an incomplete history, a presence does."""
    d = m.declared
    if invariant.white_box and not d.white_box:
        return NOT_APPLICABLE, "black-box target"
    if invariant.queue_policies and d.queue_policy not in invariant.queue_policies:
        return NOT_APPLICABLE, f"queue policy {d.queue_policy}"
    if invariant.mqtt5_only and not m.mqtt5():
        return NOT_APPLICABLE, "no MQTT 5 connection"
    if invariant.id.startswith("shared.") and not any(shared(s.topic_filter) for s in m.subscriptions):
        return NOT_APPLICABLE, "no shared subscription"
    if invariant.id == "meta.history_complete" and incomplete:
        return UNKNOWN, "; ".join(incomplete)
    if unknown:
        return UNKNOWN, unknown
    if invariant.needs_v2 and m.run.version < 2:
        return UNKNOWN, f"schema version {m.run.version}"
    if invariant.reported_only:
        return PASS, "reported"
    if invariant.declared_allowance:
        return (ALLOWED, "not promised") if count else (PASS, "")
    if count and invariant.id in d.allowed:
        return PASS, "allowed by checks.allowed"
    if invariant.needs_complete_history and incomplete:
        return UNKNOWN, "; ".join(incomplete)
    return (FAIL, "") if count else (PASS, "")
