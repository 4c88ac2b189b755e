"""Routing a run's links through the proxy: one proxy per broker node on the client -> broker link, listening
where the clients will connect instead of the node (distinct addresses: a 127.0.0.x of its own with the node's
port; loopback: a free port on 127.0.0.1).  Returns the topology's ``link_proxies`` (faults/latency.py)."""

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
