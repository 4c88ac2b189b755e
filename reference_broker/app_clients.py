"""The pure half of the APPLICATION path (application.py has the delivery): which client is APPLICATION, its
Kafka topic and consumer group as TBMQ names them, the packet id of an offset, the offset a pack may commit.
Imported by the config, the Kafka path and the connection alike; it imports nothing of the broker.  The checkers
read the same ``application_clients`` rules with contracts/app_clients.py (the broker imports nothing of Ordeal);
tests/unit/test_app_clients_contract.py keeps the two classifications in step."""

from __future__ import annotations

import fnmatch
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DEVICE, APPLICATION = "DEVICE", "APPLICATION"
APP_TOPIC_PREFIX = "tbmq.msg.app."                                  # TBMQ MqttApplicationClientUtil
APP_CONSUMER_GROUP_PREFIX = "application-persisted-msg-consumer-group-"
MAX_KAFKA_TOPIC = 249                                               # Kafka's limit on a topic name
_ALPHANUMERIC = re.compile(r"[a-zA-Z0-9]+")
ACK_STRATEGIES = ("retry", "skip")
PACKET_IDS = 65535


@dataclass(frozen=True)
class AppClientRule:
    """One ``application_clients`` entry: a client is APPLICATION when every given field matches it."""

    client_id: str | None = None   # glob on the client id (fnmatch, case-sensitive)
    username: str | None = None    # the CONNECT's user name, exactly

    def matches(self, client_id: str, username: str | None) -> bool:
        if self.client_id is not None and not fnmatch.fnmatchcase(client_id, self.client_id):
            return False
        return self.username is None or username == self.username


def parse_rules(source: str, value: Any) -> tuple[AppClientRule, ...]:
    """``application_clients`` from a config file: a list of tables with ``client_id`` and / or ``username``."""
    where = f"{source}: application_clients"
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise ValueError(f"{where} = {value!r}: expected a list of tables like "
                         "{client_id = \"app-*\"} or {username = \"analytics\"}")
    rules = []
    for index, item in enumerate(value):
        if isinstance(item, AppClientRule):
            rules.append(item)
            continue
        if not isinstance(item, Mapping):
            raise ValueError(f"{where}[{index}] = {item!r}: expected a table with client_id and / or username")
        unknown = sorted(set(item) - {"client_id", "username"})
        if unknown:
            raise ValueError(f"{where}[{index}]: unknown key(s) {', '.join(unknown)}; allowed: client_id (a glob "
                             "on the client id), username")
        if not item:
            raise ValueError(f"{where}[{index}]: empty rule; give client_id (a glob) and / or username")
        for key in ("client_id", "username"):
            if key in item and (not isinstance(item[key], str) or not item[key]):
                raise ValueError(f"{where}[{index}].{key} = {item[key]!r}: expected a non-empty string")
        rules.append(AppClientRule(item.get("client_id"), item.get("username")))
    return tuple(rules)


def classify(rules: tuple[AppClientRule, ...], client_id: str, username: str | None) -> str:
    """DEVICE or APPLICATION: TBMQ takes it from the client's credentials, this broker from the first rule that
    fits; a client no rule fits is a DEVICE (TBMQ's type for a client without credentials)."""
    return APPLICATION if any(rule.matches(client_id, username) for rule in rules) else DEVICE


def app_topic(client_id: str) -> str:
    """The client's Kafka topic, as TBMQ names it: ``tbmq.msg.app.<client id>`` when the id is alphanumeric,
    else (Kafka allows only ``[a-zA-Z0-9._-]``) the SHA-256 hex of the id.  An alphanumeric id too long for a
    Kafka topic name is hashed as well (TBMQ would fail to create the topic)."""
    if _ALPHANUMERIC.fullmatch(client_id) and len(APP_TOPIC_PREFIX) + len(client_id) <= MAX_KAFKA_TOPIC:
        return APP_TOPIC_PREFIX + client_id
    return APP_TOPIC_PREFIX + hashlib.sha256(client_id.encode()).hexdigest()


def app_consumer_group(client_id: str) -> str:
    return APP_CONSUMER_GROUP_PREFIX + client_id


def packet_id_for(offset: int) -> int:
    """1..65535 from the record's offset: the same message has the same packet id on every node and every
    reconnect, and a window of at most 65535 consecutive offsets never reuses one."""
    return offset % PACKET_IDS + 1


def acked_prefix_end(offsets: list[int], done: set[int]) -> int | None:
    """The offset to commit for a pack (``offsets`` ascending): the first not yet acknowledged, or one past the
    last when all are; None when the first is not done (nothing to commit yet)."""
    for offset in offsets:
        if offset not in done:
            return offset if offset != offsets[0] else None
    return offsets[-1] + 1 if offsets else None
