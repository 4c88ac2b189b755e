"""Routing a run's links through the proxy.  Returns / fills the topology's ``link_proxies`` (faults/latency.py).

- client -> broker (``route_client_links``, after the nodes started): one proxy per broker node, listening where
  the clients will connect instead of the node (distinct addresses: a 127.0.0.x of its own with the node's port;
  loopback: a free port on 127.0.0.1).
- broker -> Kafka, broker -> Redis (``LinkRouter``, while the topology starts its nodes): one proxy per node on
  the node's own address with a free port, made before the node starts, so that the node can advertise (Tansu)
  or announce (Redis) it.  The proxy's connections to the node then leave from the node's own address too
  (harness/toxiproxy/server.py), so a network fault on the node's address cuts the proxied link as the direct one.
"""

from __future__ import annotations

from typing import Any

from faults.latency import CLIENT_BROKER, create_proxy
from harness.addresses import AddressPlan


def route_client_links(api: str, brokers: list[Any], addresses: AddressPlan) -> dict[str, Any]:
    """A proxy before each broker node (``brokers``: node handles with name, host, port); the link_proxies
    mapping with its routes under ``client-broker``."""
    routes = {}
    for node in brokers:
        if addresses.mode == "distinct":
            host, port = addresses.allocate(node.port)
            listen = f"{host}:{port}"
        else:
            listen = "127.0.0.1:0"
        routes[node.name] = create_proxy(api, f"{CLIENT_BROKER}-{node.name}", listen, f"{node.host}:{node.port}")
    return {"api": api, "links": {CLIENT_BROKER: routes}}


class LinkRouter:
    """The proxies of the links routed before the nodes start (``links``: e.g. {"broker-kafka"}).  The topology
    asks ``listen_for`` for each node it is about to start on such a link; ``link_proxies`` is the mapping
    (kept up to date: the topology's attribute can be this very dict)."""

    def __init__(self, api: str, links: frozenset[str] | set[str]) -> None:
        self.api = api
        self.links = frozenset(links)
        self.link_proxies: dict[str, Any] = {"api": api, "links": {link: {} for link in sorted(self.links)}}

    def listen_for(self, link: str, name: str, host: str, port: int) -> tuple[str, int] | None:
        """The proxy's address before node ``name`` (listening on ``host:port``) on ``link``; None when the link
        is not routed.  Asked again for the same node (a restart with the same config), the same proxy."""
        if link not in self.links:
            return None
        routes = self.link_proxies["links"][link]
        if name not in routes:
            routes[name] = create_proxy(self.api, f"{link}-{name}", f"{host}:0", f"{host}:{port}")
        listen_host, _, listen_port = routes[name]["listen"].rpartition(":")
        return listen_host, int(listen_port)


def proxied_endpoints(endpoints: list[tuple[str, int, str]], link_proxies: dict[str, Any] | None
                      ) -> list[tuple[str, int, str]]:
    """The clients' endpoints with each proxied broker node's address replaced by its proxy's."""
    routes = (link_proxies or {}).get("links", {}).get(CLIENT_BROKER, {})
    result = []
    for host, port, name in endpoints:
        if name in routes:
            proxy_host, _, proxy_port = routes[name]["listen"].rpartition(":")
            host, port = proxy_host, int(proxy_port)
        result.append((host, port, name))
    return result
