"""Which sessions a topic reaches: a trie over topic-filter levels, so the fan-out costs per message the
depth of the topic, not the number of subscriptions (the seeds' P2P pattern has one filter per pair)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class _Node:
    __slots__ = ("children", "exact", "below")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.exact: dict[str, int] = {}   # client -> QoS of filters ending here
        self.below: dict[str, int] = {}   # client -> QoS of filters ending in "/#" here (this level and below)


class TopicIndex:
    def __init__(self, subscriptions: Mapping[str, Mapping[str, Any]]) -> None:
        """``subscriptions``: client -> record with ``filters`` {filter: QoS} (store.all_subscriptions())."""
        self.root = _Node()
        self.records = dict(subscriptions)
        for client, record in subscriptions.items():
            for topic_filter, qos in record.get("filters", {}).items():
                self._add(topic_filter, client, int(qos))

    def _add(self, topic_filter: str, client: str, qos: int) -> None:
        node = self.root
        levels = topic_filter.split("/")
        for index, level in enumerate(levels):
            if level == "#" and index == len(levels) - 1:
                node.below[client] = max(qos, node.below.get(client, -1))
                return
            node = node.children.setdefault(level, _Node())
        node.exact[client] = max(qos, node.exact.get(client, -1))

    def match(self, topic: str) -> dict[str, int]:
        """client -> the highest QoS among that client's filters matching ``topic``."""
        found: dict[str, int] = {}
        levels = topic.split("/")
        dollar = topic.startswith("$")

        def take(grants: dict[str, int]) -> None:
            for client, qos in grants.items():
                if qos > found.get(client, -1):
                    found[client] = qos

        # walk every branch that can match: the literal level and "+" (each level); "#" ends a branch
        frontier = [self.root]
        for index, level in enumerate(levels):
            next_frontier = []
            for node in frontier:
                if not (dollar and index == 0):
                    take(node.below)           # "a/#" matches "a/b/..."; "#" matches all but $-topics
                    wildcard = node.children.get("+")
                    if wildcard is not None:
                        next_frontier.append(wildcard)
                child = node.children.get(level)
                if child is not None:
                    next_frontier.append(child)
            frontier = next_frontier
            if not frontier:
                return found
        for node in frontier:
            take(node.exact)
            take(node.below)                   # "a/#" also matches "a"
        return found
