"""The MQTT 5 PUBLISH properties a broker must forward unchanged, as one canonical string (the history's
``props`` column, docs/history.md), and the ones the workload's MQTT 5 publishers send.

A broker forwards the Payload Format Indicator, Content Type, Response Topic, Correlation Data and every User
Property to each subscriber unaltered, the user properties in their order ([MQTT-3.3.2-4], [MQTT-3.3.2-15],
[MQTT-3.3.2-16], [MQTT-3.3.2-17], [MQTT-3.3.2-18], [MQTT-3.3.2-20]).  The history keeps them as canonical JSON
on both sides (a publish_invoke as sent, a delivery as received), so "forwarded unchanged" is equality of two
strings.  Message Expiry Interval (reduced by the broker), Subscription Identifiers (the broker's) and Topic
Alias (per connection) are not among them: they have columns of their own or are not forwarded.

Properties are read by attribute name (paho-mqtt's ``Properties``: PayloadFormatIndicator, ContentType,
ResponseTopic, CorrelationData, UserProperty), so this module imports no MQTT library.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

# (the canonical JSON key, the property's attribute name in paho-mqtt), in the order the keys are documented
FORWARDED = (
    ("payload_format", "PayloadFormatIndicator"),
    ("content_type", "ContentType"),
    ("response_topic", "ResponseTopic"),
    ("correlation_data", "CorrelationData"),
    ("user_properties", "UserProperty"),
)


def forwarded_json(properties: Any) -> str | None:
    """The canonical JSON of the forwarded properties among ``properties`` (a paho ``Properties`` or anything
    with those attributes), or None when there is none of them (or no properties at all).

    Keys only of the properties present: "payload_format" (int), "content_type" (str), "response_topic" (str),
    "correlation_data" (hex str), "user_properties" (list of [key, value] pairs in wire order); sorted keys,
    no whitespace."""
    if properties is None:
        return None
    found: dict[str, Any] = {}
    for key, name in FORWARDED:
        value = getattr(properties, name, None)
        if value is None:
            continue
        if key == "payload_format":
            found[key] = int(value)
        elif key == "correlation_data":
            found[key] = bytes(value).hex()
        elif key == "user_properties":
            found[key] = [[str(k), str(v)] for k, v in value]
        else:
            found[key] = str(value)
    if not found:
        return None
    return json.dumps(found, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class ForwardedProperties:
    """The forwarded properties of one PUBLISH, as values (what a publisher sets on its ``Properties``)."""

    payload_format: int
    content_type: str
    response_topic: str
    correlation_data: bytes
    user_properties: tuple[tuple[str, str], ...]

    def attributes(self) -> tuple[tuple[str, Any], ...]:
        """(paho attribute name, value) in the order to set them; each user property is set on its own, in
        order (paho appends them)."""
        values = (self.payload_format, self.content_type, self.response_topic, self.correlation_data)
        single = tuple(zip([name for _, name in FORWARDED[:4]], values, strict=True))
        return single + tuple(("UserProperty", pair) for pair in self.user_properties)


# What the workload's MQTT 5 publishers send with [workload] mqtt5_properties = true.  Payload Format 0: the
# identity payload is binary (1 would claim UTF-8, which a broker may refuse with 0x99, [MQTT-3.3.2-4]).
WORKLOAD_CONTENT_TYPE = "application/x-ordeal-identity"
WORKLOAD_USER_KEY = "ordeal-order"  # two user properties with this one key: their order must survive


def workload_properties(publisher: str, seq: int) -> ForwardedProperties:
    """The forwarded properties of ``publisher``'s message ``seq``: fixed but for the correlation data and the
    response topic, which name the message, so a broker that mixes up two messages' properties shows it."""
    return ForwardedProperties(
        payload_format=0,
        content_type=WORKLOAD_CONTENT_TYPE,
        response_topic=f"ordeal/reply/{publisher}",
        correlation_data=f"{publisher}#{seq}".encode(),
        user_properties=((WORKLOAD_USER_KEY, "first"), (WORKLOAD_USER_KEY, f"second-{seq}")),
    )
