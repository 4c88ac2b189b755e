"""Client credentials of a target as deployed: a scenario's ``[target.credentials]`` table.

A user name and password shared by every client, and per client the first ``[[target.credentials.clients]]``
entry whose ``match`` (a glob on the client id, e.g. ``test_sub_*``) fits; each value is literal or read from
an environment variable at load (``username_env`` / ``password_env``, with an optional ``*_default`` for an
unset variable).  A variable that is not set and has no default refuses the scenario at load, naming the
file, the key and the variable.

Passwords never leave this module in clear: ``to_dict`` (scenario.json) writes ``"***"`` for every password
and keeps the variable's name, and the dataclasses' repr leaves them out.  MQTT puts the user name and the
password in the CONNECT payload (MQTT 3.1.1 and 5 §3.1.2.8-9, §3.1.3.4-5).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from contracts.validation import Section

MASK = "***"  # what scenario.json and every other written file shows for a password
PROBE_CLIENT_ID = "ordeal-probe"  # the client id of the harness's own readiness and protocol probes
MAX_FIELD_BYTES = 65535  # a UTF-8 string / binary data field of MQTT: two length bytes
_ENTRY_KEYS = ("username", "username_env", "username_default", "password", "password_env", "password_default")


@dataclass(frozen=True)
class Credential:
    """One user name and (optional) password, resolved at load; ``*_env`` name the variables they came
    from ("" = literal in the scenario), ``match`` the client-id glob of a per-client entry ("" = shared)."""

    username: str
    password: str | None = field(default=None, repr=False)
    username_env: str = ""
    password_env: str = ""
    username_default: str | None = None
    password_default: str | None = field(default=None, repr=False)
    match: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The entry as the scenario gave it, every password masked (readable again by the loader)."""
        entry: dict[str, Any] = {"match": self.match} if self.match else {}
        if self.username_env:
            entry["username_env"] = self.username_env
            if self.username_default is not None:
                entry["username_default"] = self.username_default
        else:
            entry["username"] = self.username
        if self.password_env:
            entry["password_env"] = self.password_env
            if self.password_default is not None:
                entry["password_default"] = MASK
        elif self.password is not None:
            entry["password"] = MASK
        return entry

    def environment(self) -> dict[str, str]:
        """The variables this entry reads, with the values the clients use (their defaults when unset)."""
        values = {self.username_env: self.username} if self.username_env else {}
        if self.password_env and self.password is not None:
            values[self.password_env] = self.password
        return values


@dataclass(frozen=True)
class Credentials:
    """Every credential of a target: ``shared`` (every client no entry matches) and ``clients`` (in the
    scenario's order; the first whose ``match`` fits a client id is that client's)."""

    shared: Credential | None = None
    clients: tuple[Credential, ...] = ()

    def __bool__(self) -> bool:
        return self.shared is not None or bool(self.clients)

    def for_client(self, client_id: str) -> Credential | None:
        """The credential a client connects with; None = anonymous (no user name, no password)."""
        for entry in self.clients:
            if fnmatch.fnmatchcase(client_id, entry.match):
                return entry
        return self.shared

    def unmatched(self, client_ids: list[str]) -> list[str]:
        """The per-client patterns that fit none of these client ids (nor the harness's probe)."""
        ids = [*client_ids, PROBE_CLIENT_ID]
        return [e.match for e in self.clients if not any(fnmatch.fnmatchcase(c, e.match) for c in ids)]

    def to_dict(self) -> dict[str, Any]:
        """scenario.json's target.credentials: the table's shape, passwords masked ({} = anonymous)."""
        table = self.shared.to_dict() if self.shared is not None else {}
        if self.clients:
            table["clients"] = [entry.to_dict() for entry in self.clients]
        return table

    def environment(self) -> dict[str, str]:
        """Every variable the credentials read, with the value the clients use: passed to the target's
        start / stop / kill commands, so a start command can make the broker's password file from them."""
        values: dict[str, str] = {}
        for entry in (*self.clients, *([self.shared] if self.shared is not None else [])):
            values.update(entry.environment())
        return values


def read_credentials(parent: Section, table: Any, environ: Mapping[str, str]) -> Credentials:
    """``[target.credentials]`` (``table``, read from ``parent``, the [target] section) -> Credentials, the
    variables read from ``environ``.  Errors are the parent's error class, naming the file and the key."""
    section_type = type(parent)
    shared_section = section_type(parent.source, "target.credentials", table)
    raw_clients = shared_section._get("clients", [], False)
    if not isinstance(raw_clients, list) or not all(isinstance(c, dict) for c in raw_clients):
        raise shared_section.fail("clients", raw_clients, "must be an array of tables: "
                                  "[[target.credentials.clients]] with match = \"client-id glob\" and a user name")
    shared = None
    if set(shared_section.table) - {"clients"}:
        shared = _read_entry(shared_section, environ, per_client=False)
    else:
        shared_section.allow(*_ENTRY_KEYS)
        shared_section.finish()
    clients: list[Credential] = []
    for index, raw in enumerate(raw_clients, start=1):
        entry = section_type(parent.source, "target.credentials.clients", raw,
                             label=f"[[target.credentials.clients]] #{index}")
        clients.append(_read_entry(entry, environ, per_client=True))
    patterns = [c.match for c in clients]
    twice = sorted({p for p in patterns if patterns.count(p) > 1})
    if twice:
        raise shared_section.fail("clients", twice, "each match pattern may appear once (the first entry "
                                  "that matches a client id is its credential)")
    return Credentials(shared=shared, clients=tuple(clients))


def _read_entry(s: Section, environ: Mapping[str, str], *, per_client: bool) -> Credential:
    match = ""
    if per_client:
        match = s.string("match", required=True, non_empty=True)
    username, username_env, username_default = _value(s, "username", environ, required=True)
    password, password_env, password_default = _value(s, "password", environ, required=False)
    s.finish()
    return Credential(username=username or "", password=password, username_env=username_env,
                      password_env=password_env, username_default=username_default,
                      password_default=password_default, match=match)


def _value(s: Section, key: str, environ: Mapping[str, str], *,
           required: bool) -> tuple[str | None, str, str | None]:
    """``key`` literal, or ``key_env`` (+ ``key_default``): (value, variable name or "", default or None)."""
    env_key, default_key = f"{key}_env", f"{key}_default"
    s.allow(key, env_key, default_key)  # the allowed keys an unknown key's message lists
    literal = key in s.table
    from_env = env_key in s.table
    shown = (lambda v: MASK) if key == "password" else (lambda v: v)  # noqa: E731 - no password in a message
    if literal and from_env:
        raise s.fail(key, shown(s.table[key]), f"give {key} or {env_key}, not both")
    if default_key in s.table and not from_env:
        raise s.fail(default_key, shown(s.table[default_key]),
                     f"is the value used when {env_key}'s variable is not set; it needs {env_key}")
    if literal:
        value = s.table[key]
        if not isinstance(value, str) or (key == "username" and not value):
            raise s.fail(key, shown(value), "must be a non-empty string" if key == "username" else "must be a string")
        _fits(s, key, value)
        return value, "", None
    if from_env:
        variable = s.string(env_key, non_empty=True)
        if not (variable.replace("_", "").isalnum() and variable.isascii() and not variable[0].isdigit()):
            raise s.fail(env_key, variable, "must be an environment variable's name (letters, digits, _)")
        default = None
        if default_key in s.table:
            default = s.table[default_key]
            if not isinstance(default, str):
                raise s.fail(default_key, shown(default), "must be a string")
        value = environ.get(variable, default)
        if value is None:
            raise s.fail(env_key, variable, f"the environment variable {variable} is not set; set it (export "
                         f"{variable}=...) or give {default_key}")
        _fits(s, env_key, value)
        return value, variable, default
    if required:
        raise s.error(f"{s.source}: {s.label} needs a user name: give {key} = \"...\" or {env_key} = \"VARIABLE\" "
                      "(MQTT sends a password only with a user name, 3.1.1 §3.1.2.9)")
    return None, "", None


def _fits(s: Section, key: str, value: str) -> None:
    if len(value.encode()) > MAX_FIELD_BYTES:
        raise s.fail(key, MASK if key.startswith("password") else value[:40] + "...",
                     f"is longer than MQTT's {MAX_FIELD_BYTES} bytes")
