"""The rule registry: every rule a family module defines (its invariant, the table it reads, its condition and
witness), every witness explanation, and ``Rules``, a group of rules over one table evaluated in one scan.

A family (order.py, durability.py, ...) adds a rule with ``@rule(invariant, table)`` on a function that returns
(condition, sort key, *witness columns), and an explanation with ``@explains(invariant, ...)`` on a function of
(witness, timeline) that returns the sentence the report shows.  The build (spark_checkers/build.py) asks
``group(table, df)`` of the catalog (catalog.py), which imports every family, for each table's rules; the
report asks the catalog's ``explain``.  A family imports this module to register; this module imports no
family.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyspark.sql import functions as F

from spark_checkers.timeline import Timeline

# The tables a rule reads, each the rows of one materialised table of the build:
SLOTS = "slots"  # one row per delivery, with its packet-id slot (job/messages.py: delivery_slots)
MESSAGES = "messages"  # one row per delivered (subscriber, message), with its publish (columns.message_table)
BACKLOGS = "backlogs"  # one row per settled offline backlog of a subscriber (its rank-1 row)
STORED_IDS = "stored_ids"  # one row per stored packet id taken after a gap (whitebox.packet_id_gaps)
QOS2_FLOWS = "qos2_flows"  # one row per QoS 2 PUBLISH a subscriber answered with PUBREC (qos.qos2_flows)
IN_FLIGHT = "in_flight"  # one row per QoS > 0 PUBLISH on an MQTT 5 connection with a Receive Maximum (flow.in_flight)
SHARED = "shared"  # one row per (shared group, message on a topic its filter matches) (spark_checkers/shared.py)
TABLES = (SLOTS, MESSAGES, BACKLOGS, STORED_IDS, QOS2_FLOWS, IN_FLIGHT, SHARED)


@dataclass(frozen=True)
class Rule:
    """One rule: ``define()`` gives (condition, sort key, *witness columns) over a row of ``table``."""

    invariant: str
    table: str
    define: Callable[[], tuple]


# Filled as the families are imported (catalog.py imports them all), in registration order.
_RULES: list[Rule] = []
_EXPLANATIONS: dict[str, Callable[[dict[str, Any], Timeline], str]] = {}


def rule(invariant: str, table: str):
    """Register the decorated function as ``invariant``'s rule over ``table`` (in registration order)."""
    if table not in TABLES:
        raise ValueError(f"rule {invariant!r}: unknown table {table!r} (expected one of {', '.join(TABLES)})")

    def add(define):
        _RULES.append(Rule(invariant, table, define))
        return define

    return add


def explains(*invariants: str):
    """Register the decorated function (witness, timeline) -> sentence as the explanation of ``invariants``."""

    def add(words):
        for invariant in invariants:
            if invariant in _EXPLANATIONS:
                raise ValueError(f"two explanations of {invariant!r}")
            _EXPLANATIONS[invariant] = words
        return words

    return add


WITNESS_FIELDS = ("invariant", "sort_key", "witness")


def witness_columns(invariant: str, sort_key, *columns) -> tuple:
    """One rule's (invariant, sort_key, witness JSON) columns, in the order of WITNESS_FIELDS."""
    return F.lit(invariant), sort_key.cast("long"), F.to_json(F.struct(*columns))


def witness(df, invariant: str, sort_key, *columns):
    return df.select("run_id", *[column.alias(name) for name, column
                                 in zip(WITNESS_FIELDS, witness_columns(invariant, sort_key, *columns), strict=True)])


class Rules:
    """Violation rules over one table, evaluated in a single scan: each row emits one (invariant, sort_key,
    witness) per rule it breaks.  ``separate()`` gives one DataFrame per rule, to pin a checker error."""

    def __init__(self, df):
        self.df = df
        self.rules: list[tuple[str, object, object, tuple]] = []

    def add(self, invariant: str, condition, sort_key, *columns) -> None:
        self.rules.append((invariant, condition, sort_key, columns))

    def combined(self):
        """One row per rule a row breaks.  First only which rules (an int per broken rule, exploded: no row for a
        row that breaks none), then the witness of each, over those few rows.

        Why in two steps: the conditions run for every row, the witnesses (a JSON object each) only for the
        rows that break a rule.  Built together, the code of all of them landed in one generated method above
        the JVM's 8000-byte limit for compiling, so the whole per-row loop of the stage ran interpreted (a
        fifth of a 10 M check's CPU samples).  Apart, the witnesses' code is a method of its own, run rarely."""
        broken = F.array_compact(F.array(*[F.when(cond, F.lit(i)) for i, (_, cond, _, _) in enumerate(self.rules)]))
        # explode_outer, not explode: for explode the optimiser infers a filter "size(array) > 0" and pushes it
        # below the projection, which generates every condition's code a second time.
        hits = (self.df.select("*", broken.alias("_broken")).select("*", F.explode_outer("_broken").alias("_rule"))
                .filter(F.col("_rule").isNotNull()))
        per_rule = [witness_columns(inv, key, *cols) for inv, _, key, cols in self.rules]

        def by_rule(field: int):  # CASE _rule WHEN 0 THEN ... : each rule's column, evaluated for its rows only
            chosen = F.when(F.col("_rule") == 0, per_rule[0][field])
            for i, columns in enumerate(per_rule[1:], 1):
                chosen = chosen.when(F.col("_rule") == i, columns[field])
            return chosen

        return hits.select("run_id", *[by_rule(i).alias(name) for i, name in enumerate(WITNESS_FIELDS)])

    def separate(self) -> list[tuple[tuple[str, ...], Any]]:
        """(the rule's invariant, its violations) per rule."""
        return [((inv,), witness(self.df.filter(cond), inv, key, *cols)) for inv, cond, key, cols in self.rules]
