"""The pure half of shared subscriptions (shared_delivery.py has the delivery): parsing ``$share/{ShareName}/{filter}``,
the Kafka topic and consumer group TBMQ gives a shared APPLICATION subscription, the QoS it is granted.  Imported by
the connection, the Kafka path and the delivery alike; it imports nothing of the broker but the codec's filter check.

TBMQ (thingsboard/tbmq): ``BrokerConstants.SHARED_SUBSCRIPTION_PREFIX = "$share/"``; ``MqttApplicationClientUtil``
names the topic after the *filter* (``tbmq.msg.app.shared.<filter>``, ``/`` -> ``.``, ``+`` -> ``slw``, the ``#`` ->
``mlw``; any other character: the SHA-256 hex of the filter) and the consumer group after the share name and that
topic (``application-shared-msg-consumer-group-<share name>-<topic>``), so two groups on one filter read one topic,
each from its own committed offset.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from reference_broker.codec import valid_filter

SHARE_PREFIX = "$share/"
SHARED_TOPIC_PREFIX = "tbmq.msg.app.shared."                        # TBMQ MqttApplicationClientUtil
SHARED_CONSUMER_GROUP_PREFIX = "application-shared-msg-consumer-group-"
MAX_KAFKA_TOPIC = 249
MAX_SHARED_QOS = 1  # granted at most QoS 1: a QoS 2 flow cannot move to another member without breaking "once"
_TOPIC_SAFE = re.compile(r"[a-zA-Z0-9/+#]+")


class SharedFilterError(ValueError):
    """A ``$share/...`` filter that is not a valid Shared Subscription ([MQTT-4.8.2-1], [MQTT-4.8.2-2])."""


@dataclass(frozen=True)
class SharedFilter:
    share_name: str
    topic_filter: str   # the filter after the share name: what messages are matched against

    @property
    def text(self) -> str:
        return f"{SHARE_PREFIX}{self.share_name}/{self.topic_filter}"


def is_shared(topic_filter: str) -> bool:
    return topic_filter.startswith(SHARE_PREFIX)


def parse_shared(text: str) -> SharedFilter:
    """``$share/{ShareName}/{filter}``: ShareName at least one character, none of ``/ + #`` ([MQTT-4.8.2-1]), then
    ``/`` and a valid, non-empty topic filter ([MQTT-4.8.2-2]).  Raises SharedFilterError saying what is wrong."""
    if not is_shared(text):
        raise SharedFilterError(f"{text!r}: a shared subscription starts with {SHARE_PREFIX!r}")
    rest = text[len(SHARE_PREFIX):]
    share_name, slash, topic_filter = rest.partition("/")
    if not share_name:
        raise SharedFilterError(f"{text!r}: the ShareName (between '$share/' and the next '/') is empty "
                                "[MQTT-4.8.2-1]")
    for bad in "+#":
        if bad in share_name:
            raise SharedFilterError(f"{text!r}: the ShareName {share_name!r} contains {bad!r}; it must not contain "
                                    "'/', '+' or '#' [MQTT-4.8.2-1]")
    if not slash or not topic_filter:
        raise SharedFilterError(f"{text!r}: no topic filter after the ShareName {share_name!r}; expected "
                                "'$share/{ShareName}/{filter}' [MQTT-4.8.2-2]")
    if not valid_filter(topic_filter):
        raise SharedFilterError(f"{text!r}: {topic_filter!r} is not a valid topic filter [MQTT-4.8.2-2]")
    return SharedFilter(share_name, topic_filter)


def shared_topic(topic_filter: str) -> str:
    """The Kafka topic of a filter's shared APPLICATION subscriptions, as TBMQ names it (see the module doc); a name
    too long for Kafka is hashed as well (TBMQ would fail to create the topic)."""
    if _TOPIC_SAFE.fullmatch(topic_filter):
        name = topic_filter.replace("/", ".").replace("+", "slw").replace("#", "mlw", 1)
        if len(SHARED_TOPIC_PREFIX) + len(name) <= MAX_KAFKA_TOPIC:
            return SHARED_TOPIC_PREFIX + name
    return SHARED_TOPIC_PREFIX + hashlib.sha256(topic_filter.encode()).hexdigest()


def shared_consumer_group(shared: SharedFilter) -> str:
    return f"{SHARED_CONSUMER_GROUP_PREFIX}{shared.share_name}-{shared_topic(shared.topic_filter)}"


def granted_shared_qos(requested: int) -> int:
    return min(requested, MAX_SHARED_QOS)
