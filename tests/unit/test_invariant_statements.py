"""Every invariant carries the normative statement it checks (contracts/invariants.py ``statement``, shown beside a
failing verdict), citing MQTT statements by their id, and docs/invariants.md names every invariant."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from contracts.invariants import INVARIANTS

DOC = Path(__file__).parents[2] / "docs" / "invariants.md"
# An MQTT normative statement's id as the specifications print it: [MQTT-3.8.4-8], [MQTT-4.7.0-1].
STATEMENT_ID = re.compile(r"\[MQTT-\d+\.\d+(?:\.\d+)?-\d+\]")


@pytest.mark.parametrize("invariant", INVARIANTS, ids=lambda i: i.id)
def test_every_invariant_has_its_statement(invariant):
    assert len(invariant.statement) > 40, f"contracts/invariants.py {invariant.id}: no statement= (or a stub)"
    cited = re.findall(r"\[MQTT-[^\]]*\]", invariant.statement)
    assert all(STATEMENT_ID.fullmatch(c) for c in cited), (invariant.id, cited)


def test_the_delivery_rules_cite_the_statements_they_check():
    """The rules of MQTT behaviour name the statement's id; the target's declarations and the suite's own do not."""
    own = ("limits.", "whitebox.", "liveness.", "logs.", "health.", "meta.")
    uncited = [i.id for i in INVARIANTS if not i.id.startswith(own) and not i.declared_allowance
               and i.id != "durability.phantom" and not STATEMENT_ID.search(i.statement)]
    assert uncited == []


def test_the_invariants_doc_names_every_invariant():
    text = DOC.read_text()
    missing = [i.id for i in INVARIANTS if f"`{i.id}`" not in text]
    assert missing == [], f"docs/invariants.md does not name {missing}"
