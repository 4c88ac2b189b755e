"""Every rule family, imported here so that each has registered its rules and explanations: the build asks
``group(table, df)`` for each table's rules, the report asks ``explain`` for a witness's words."""

from __future__ import annotations

from typing import Any

from spark_checkers.rules import (  # noqa: F401 - imported to register their rules
    duplicates,
    durability,
    expiry,
    flow,
    health,
    limits,
    liveness,
    losses,
    meta,
    order,
    props,
    qos,
    retained,
    shared,
    whitebox,
    will,
)
from spark_checkers.rules.registry import _EXPLANATIONS, _RULES, Rule, Rules
from spark_checkers.timeline import Timeline


def rules_of(table: str) -> list[Rule]:
    """The rules over ``table``, in the order their families registered them."""
    return [r for r in _RULES if r.table == table]


def group(table: str, df) -> Rules:
    """Every rule over ``table`` as one group over ``df`` (the table's rows)."""
    rules = Rules(df)
    for r in rules_of(table):
        rules.add(r.invariant, *r.define())
    return rules


def explain(invariant: str, w: dict[str, Any], timeline: Timeline) -> str:
    """A raw witness in plain words (its family's explanation), or the witness itself if it has none."""
    words = _EXPLANATIONS.get(invariant)
    return words(w, timeline) if words is not None else str(w)
