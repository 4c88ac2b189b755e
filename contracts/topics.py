"""MQTT topic filters (MQTT 3.1.1 §4.7, MQTT 5 §4.7): ``+`` matches one level, ``#`` the rest; a shared
subscription ``$share/GROUP/FILTER`` (MQTT 5 §4.8.2) matches what its FILTER matches, once per group."""

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


SHARE_PREFIX = "$share/"


def shared_filter(topic_filter: str) -> str | None:
    """The FILTER of a shared subscription ``$share/GROUP/FILTER`` (MQTT 5 §4.8.2), None for any other filter
    (and for a malformed one: no group name, or no filter after it)."""
    if not topic_filter.startswith(SHARE_PREFIX):
        return None
    parts = topic_filter.split("/", 2)
    group = parts[1] if len(parts) > 1 else ""
    if len(parts) < 3 or not group or not parts[2] or any(c in group for c in "+#"):
        return None
    return parts[2]


def matching_filter(topic_filter: str) -> str:
    """What a subscription's filter matches: a shared subscription's FILTER, else the filter itself."""
    return shared_filter(topic_filter) or topic_filter
