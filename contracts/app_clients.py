"""Which clients the reference broker serves as APPLICATION clients (TBMQ's client type; docs/reference-broker.md
"APPLICATION clients"), read from its ``application_clients`` rules as scenario.json's "broker" carries them: a
list of tables with ``client_id`` (a glob on the client id, case-sensitive) and / or ``username`` (the CONNECT's
user name, exactly); a client is APPLICATION when every field of some rule matches it, else a DEVICE.

The two readings of the checks (spark_checkers and oracle/) take it from here.  The broker applies the same rules
in reference_broker/app_clients.py: it imports nothing of Ordeal (its container image holds reference_broker/
and lua/ only), so tests/unit/test_app_clients_contract.py holds the two to the same answers.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from typing import Any


def is_application(rules: Iterable[Mapping[str, Any]], client_id: str, username: str | None = None) -> bool:
    """Whether ``client_id`` (with ``username``; None: an anonymous CONNECT, as every client of the reference
    target is) is an APPLICATION client under ``rules``."""
    for rule in rules:
        pattern, user = rule.get("client_id"), rule.get("username")
        if pattern is not None and not fnmatch.fnmatchcase(client_id, pattern):
            continue
        if user is None or username == user:
            return True
    return False


def application_rules(broker: Mapping[str, Any] | None, source: str = "scenario.json") -> tuple[dict[str, str], ...]:
    """The ``application_clients`` rules of a scenario.json "broker" table (absent: none, every client is a
    DEVICE).  A ValueError names ``source`` when they are not a list of rules the broker would take."""
    value = (broker or {}).get("application_clients") or ()
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise ValueError(f"{source}: broker.application_clients must be a list of rules, got {value!r}")
    rules = []
    for index, rule in enumerate(value):
        fields = {k: rule.get(k) for k in ("client_id", "username")} if isinstance(rule, Mapping) else {}
        fields = {k: v for k, v in fields.items() if v is not None}
        if not fields or not all(isinstance(v, str) and v for v in fields.values()) or set(rule) - set(fields):
            raise ValueError(f"{source}: broker.application_clients[{index}] = {rule!r}: expected a table with "
                             "client_id (a glob on the client id) and / or username")
        rules.append(fields)
    return tuple(rules)
