"""Topic filters (MQTT 3.1.1 / 5 §4.7), written again here so that the oracle does not lean on the matcher
the checkers use: ``+`` is one level, ``#`` (last) is that level's parent and everything below it, and a topic
beginning with ``$`` matches no filter that begins with a wildcard (§4.7.2).  A shared subscription
``$share/NAME/FILTER`` (MQTT 5 §4.8.2) matches what FILTER matches."""

from __future__ import annotations


def shared(topic_filter: str) -> bool:
    """A shared subscription's filter: its messages are the group's, one member gets each."""
    return topic_filter.startswith("$share/") and topic_filter.count("/") >= 2


def matches(topic_filter: str, topic: str) -> bool:
    if shared(topic_filter):
        topic_filter = topic_filter.split("/", 2)[2]
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    want, have = topic_filter.split("/"), topic.split("/")
    if want[-1] == "#":
        head = want[:-1]
        return len(have) >= len(head) and all(w in ("+", h) for w, h in zip(head, have, strict=False))
    return len(want) == len(have) and all(w in ("+", h) for w, h in zip(want, have, strict=True))
