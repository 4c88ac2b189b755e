"""Name codes: every client, publisher, topic, node and body hash the Spark side carries as a 64-bit code
(``coded``), and the way back to the names after the collect (``Names``, ``lookup_names``)."""

from __future__ import annotations

from dataclasses import dataclass

import xxhash
from pyspark.sql import functions as F

# --- Codes: the names and body hashes the Spark side carries as numbers ------------------------------------
# Every client, publisher, topic, node and body hash is a 64-bit code (Spark's xxhash64, seed 42) from the
# first step on, and a witness or metric key carries it as CODE_MARK + the code, named again after the collect
# (``Names``).  Why: Spark reads a cached table as columns only if every column is a primitive; one string made
# every read of it build a row per cached row, and every sort and shuffle carried the strings.  Coded, the
# delivery slots and the publishes are all numbers, and a big check is faster (docs/measurements.md).
CODED = ("client", "publisher", "topic", "node", "body_hash")
# Coded too, where a table has the column: a delivery's and a publish's forwarded MQTT 5 properties (canonical JSON,
# compared by code: rules/props.py), named again in a witness like any other code.
CODED_IF_PRESENT = ("props",)


# A coded value in a witness: U+0000 cannot begin a name (MQTT forbids it in client ids and topics
# [MQTT-1.5.4-2]; the nodes and hashes are the harness's own).
CODE_MARK = "\x00"


_CODE_SEED = 42  # Spark's xxhash64 seed


def code_of(name: str | None) -> int | None:
    """The code Spark's ``coded`` gives ``name``: xxhash64 of its UTF-8 bytes, seed 42, as a signed long."""
    if name is None:
        return None
    code = xxhash.xxh64_intdigest(name.encode(), seed=_CODE_SEED)
    return code - (1 << 64) if code >= 1 << 63 else code


def coded(column):
    """A name column as its code (null stays null: Spark's xxhash64 of null is the seed)."""
    return F.when(column.isNotNull(), F.xxhash64(column))


def named(column):
    """A coded column as a witness or metric key carries it: CODE_MARK + the code, named after the collect."""
    return F.concat(F.lit(CODE_MARK), column.cast("string"))


def witness_name(column: str, alias: str | None = None):
    """A coded column of a witness (``named``), under its own name or ``alias`` ("first.node" as "node")."""
    return named(F.col(column)).alias(alias or column)


def encode_events(events):
    """The events with every column of CODED as its code."""
    return events.select(*[coded(F.col(c)).alias(c) if c in CODED or c in CODED_IF_PRESENT else F.col(c)
                           for c in events.columns])


def lookup_names(events, codes: set[int]) -> dict[int, str]:
    """The names of ``codes`` that the caller does not know (a phantom's publisher, a topic never published, a
    body hash): one scan of the coded columns."""
    if not codes:
        return {}
    columns = (*CODED, *(c for c in CODED_IF_PRESENT if c in events.columns))
    name = F.explode(F.array(*[F.col(c) for c in columns])).alias("name")
    found = (events.select(name).filter(F.col("name").isNotNull()).select("name", coded(F.col("name")).alias("code"))
             .filter(F.col("code").isin(*codes)).distinct().collect())
    return {row["code"]: row["name"] for row in found}


@dataclass
class Names:
    """Code -> name for what a check's witnesses and metric keys carry coded (``named``)."""

    known: dict[int, str]

    @classmethod
    def of(cls, names) -> Names:
        """From the names the driver knows (the timelines' clients, the topics and nodes); a ValueError names
        two of them that share a code (the check would merge them)."""
        known: dict[int, str] = {}
        for name in names:
            code = code_of(name)
            if known.setdefault(code, name) != name:
                raise ValueError(f"the names {known[code]!r} and {name!r} have the same 64-bit code {code}: "
                                 "the checkers cannot tell them apart")
        return cls(known)

    def unknown(self, values) -> set[int]:
        """The codes in ``values`` (witnesses, keys) that have no name yet."""
        return {code for value in values for code in _codes(value) if code not in self.known}

    def learn(self, found: dict[int, str]) -> None:
        self.known.update(found)

    def decode(self, value):
        """``value`` (a witness, a key) with every coded string named again."""
        if isinstance(value, str) and value.startswith(CODE_MARK):
            code = int(value[1:])
            return self.known.get(code, f"<code {code}>")
        if isinstance(value, dict):
            return {k: self.decode(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.decode(v) for v in value]
        return value


def _codes(value):
    """Every code a witness or key carries (``named``), nested or not."""
    if isinstance(value, str) and value.startswith(CODE_MARK):
        yield int(value[1:])
    elif isinstance(value, dict | list):
        for v in value.values() if isinstance(value, dict) else value:
            yield from _codes(v)
