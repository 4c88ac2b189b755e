"""TLS listeners of a target as deployed: a scenario's ``[target.tls]`` table.

``enabled = true``: every MQTT connection of the run (the workload's clients, the readiness and protocol
probes) speaks MQTT over TLS to the target.  The run makes a CA of its own and a server certificate for the
target's address(es) before the target starts (harness/tls.py) and offers them to the target's argv, env and
config files as the placeholders {tls_ca} {tls_cert} {tls_key} {tls_dir}.  ``verify`` (default true): the
clients verify the server's certificate against the run's CA and its name (``server_name``, else the address
they connect to); false = encrypted, not authenticated.  ``server_name``: the name the clients send as SNI
and check the certificate for (the run's certificate carries it too), for a broker that selects its
certificate by name.

A TLS placeholder in the target's keys without ``enabled = true`` refuses the scenario at load, naming the
key (the certificate files would not exist).  Nothing here is secret: the key stays in the run directory.
"""

from __future__ import annotations

import ipaddress
import string
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from contracts.validation import Section

PLACEHOLDERS = ("tls_ca", "tls_cert", "tls_key", "tls_dir")  # what [target] argv, env and files may use
MAX_NAME_LENGTH = 253  # a DNS name (RFC 1035 §2.3.4)
_SKIPPED = ("tls", "credentials", "promises")  # [target] keys a TLS placeholder cannot appear in


@dataclass(frozen=True)
class TlsSpec:
    """``[target.tls]``: off by default (plain MQTT)."""

    enabled: bool = False
    server_name: str = ""  # the name verified and sent as SNI; "" = the address the client connects to
    verify: bool = True  # check the server's certificate chain (the run's CA) and name

    def to_dict(self) -> dict[str, Any]:
        """scenario.json's target.tls: every key, defaults filled in (readable again by the loader)."""
        return {"enabled": self.enabled, "server_name": self.server_name, "verify": self.verify}


def read_tls(parent: Section, table: Any) -> TlsSpec:
    """``[target.tls]`` (``table``, read from ``parent``, the [target] section) -> TlsSpec.  Errors are the
    parent's error class, naming the file and the key."""
    if not isinstance(table, dict):
        raise parent.fail("tls", table, "must be a table: [target.tls] with enabled = true (docs/scenarios.md, "
                          "\"TLS listeners\")")
    s = type(parent)(parent.source, "target.tls", table)
    if table and "enabled" not in table:
        raise s.error(f"{s.source}: {s.label} enabled is required: true = every MQTT connection of the run uses "
                      "TLS, false = plain MQTT")
    spec = TlsSpec(enabled=s.boolean("enabled", False), server_name=s.string("server_name", ""),
                   verify=s.boolean("verify", True))
    s.finish()
    if spec.server_name and not _is_name(spec.server_name):
        raise s.fail("server_name", spec.server_name, "must be a host name (letters, digits, '-' and '.', at most "
                     f"{MAX_NAME_LENGTH} characters) or an IP address: the name the clients check the "
                     "broker's certificate for")
    used = None if spec.enabled else next(_placeholders_used(parent.table), None)
    if used is not None:
        raise parent.fail(used[0], "{" + used[1] + "}", "the TLS placeholders need [target.tls] enabled = true "
                          "(without it the run makes no certificates)")
    return spec


def _is_name(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        pass
    if len(name) > MAX_NAME_LENGTH or not name.isascii():
        return False
    labels = name.rstrip(".").split(".")
    return all(label and len(label) <= 63 and label.replace("-", "").isalnum() and not label.startswith("-")
               and not label.endswith("-") for label in labels)


def _placeholders_used(table: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(key, placeholder) for each TLS placeholder in the [target] table's strings (argv, env, files)."""
    for key, value in table.items():
        if key not in _SKIPPED:
            yield from _in_value(key, value)


def _in_value(key: str, value: Any) -> Iterator[tuple[str, str]]:
    if isinstance(value, str):
        try:
            fields = [parsed[1] for parsed in string.Formatter().parse(value)]
        except ValueError:  # not a format string at all: the target reports it when it fills it in
            return
        for name in fields:
            if name in PLACEHOLDERS:
                yield key, name
    elif isinstance(value, list):
        for item in value:
            yield from _in_value(key, item)
    elif isinstance(value, dict):
        for name, item in value.items():
            yield from _in_value(f"{key}.{name}", item)
