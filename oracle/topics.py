"""Topic filters (MQTT 3.1.1 / 5 §4.7), written again here so that the oracle does not lean on the matcher
the checkers use: ``+`` is one level, ``#`` (last) is that level's parent and everything below it, and a topic
beginning with ``$`` matches no filter that begins with a wildcard (§4.7.2)."""

from __future__ import annotations


def matches(topic_filter: str, topic: str) -> bool:
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    want, have = topic_filter.split("/"), topic.split("/")
    if want[-1] == "#":
        head = want[:-1]
        return len(have) >= len(head) and all(w in ("+", h) for w, h in zip(head, have, strict=False))
    return len(want) == len(have) and all(w in ("+", h) for w, h in zip(want, have, strict=True))
