"""A checker report (report.json's dict, spark_checkers.api.check_runs) set beside the oracle's judgement of the
same run: per covered invariant, the verdict and the count must be the same (``disagreements``); what differs
is said with both answers and the items each side counted (``describe``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from oracle.judge import Judgement


@dataclass(frozen=True)
class Disagreement:
    run_dir: str
    invariant: str
    checker: tuple[str, int]  # (verdict, count)
    oracle: tuple[str, int]
    oracle_items: tuple
    checker_witnesses: tuple[dict, ...]  # the raw witnesses the report shows (capped by the checker)
    why: tuple[str, str]  # (checker's reason, oracle's reason)


def disagreements(report: dict[str, Any], judgement: Judgement) -> list[Disagreement]:
    by_id = {i["id"]: i for i in report["invariants"]}
    out = []
    for invariant, mine in judgement.verdicts.items():
        theirs = by_id.get(invariant)
        if theirs is None:
            continue  # an invariant this checker does not decide yet
        if (theirs["verdict"], theirs["count"]) != (mine.verdict, mine.count):
            out.append(Disagreement(
                str(judgement.run_dir), invariant, (theirs["verdict"], theirs["count"]), (mine.verdict, mine.count),
                mine.items, tuple(w.get("data", w) for w in theirs.get("witnesses") or ()),
                (theirs.get("reason") or "", mine.reason)))
    return out


def _item_of(witness: dict) -> tuple:
    """The oracle's item for a checker witness, where the witness names one (gaps name a range)."""
    client, publisher = witness.get("client"), witness.get("publisher")
    if "first_seq" in witness:
        return tuple((client, publisher, s) for s in range(witness["first_seq"], witness["last_seq"] + 1))
    if publisher is not None and witness.get("pub_seq") is not None:
        return ((client, publisher, witness["pub_seq"]),)
    if witness.get("seq") is not None and client is not None:
        return ((client, witness["seq"]),)
    return ()


def describe(d: Disagreement) -> str:
    """The disagreement in words: where, both answers, and the items counted by one side and not the other
    (as far as the checker's capped witnesses name them)."""
    named = {item for w in d.checker_witnesses for item in _item_of(w)}
    mine = set(d.oracle_items)
    lines = [f"{d.run_dir}: {d.invariant}: checker {d.checker[0]} (count {d.checker[1]}), oracle {d.oracle[0]} "
             f"(count {d.oracle[1]})"]
    if d.why[0] or d.why[1]:
        lines.append(f"  reasons: checker {d.why[0]!r}; oracle {d.why[1]!r}")
    if named or mine:
        lines.append(f"  only the oracle counted: {sorted(mine - named, key=repr)[:20]}")
        lines.append(f"  only the checker's witnesses name: {sorted(named - mine, key=repr)[:20]}")
    if not named and d.checker_witnesses:
        lines.append(f"  checker witnesses: {list(d.checker_witnesses)[:5]}")
    return "\n".join(lines)
