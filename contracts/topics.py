"""MQTT topic filters (MQTT 3.1.1 §4.7, MQTT 5 §4.7): ``+`` matches one level, ``#`` the rest."""

from __future__ import annotations


def filter_matches(topic_filter: str, topic: str) -> bool:
    """True when ``topic`` matches ``topic_filter``.  Topics starting with ``$`` never match a filter that
    starts with a wildcard (§4.7.2)."""
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    filter_levels = topic_filter.split("/")
    topic_levels = topic.split("/")
    for index, level in enumerate(filter_levels):
        if level == "#":
            return True  # '#' also matches the parent level: 'a/#' matches 'a'
        if index >= len(topic_levels):
            return False
        if level != "+" and level != topic_levels[index]:
            return False
    return len(filter_levels) == len(topic_levels)
