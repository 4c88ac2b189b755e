"""Outgoing connections of a broker node leave from the node's own --listen address.

Inside a private network namespace every node has its own 127.0.0.x (harness/addresses.py) and network
faults (faults/network.py) match packets by address.  Left alone, the kernel gives a connection to
127.0.0.9 the source 127.0.0.1, so a "broker <-> Redis" rule would never match the broker's traffic.

redis-py's asyncio client (``asyncio.open_connection``), aiokafka (``loop.create_connection`` in
``AIOKafkaConnection.connect``) and the node links (``asyncio.open_connection``) all end in
``loop.create_connection``; none of them takes a source address.  So the node wraps its event loop's
``create_connection`` once at start-up and adds ``local_addr=(listen host, 0)`` to every TCP connection
towards an IPv4 address of the same scope (loopback to loopback, other to other)."""

from __future__ import annotations

import asyncio
import ipaddress
from typing import Any


def source_address_for(listen_host: str, remote_host: Any) -> str | None:
    """The address to bind an outgoing connection to, or None to leave it to the kernel.

    Only a specific IPv4 listen address is used, and only towards an IPv4 literal of the same scope: a
    loopback source cannot reach another host, and a name (or IPv6) would need the resolver's choice."""
    try:
        own = ipaddress.ip_address(listen_host)
        remote = ipaddress.ip_address(remote_host) if isinstance(remote_host, str) else None
    except ValueError:
        return None
    if own.version != 4 or own.is_unspecified or remote is None or remote.version != 4:
        return None
    if own.is_loopback != remote.is_loopback:
        return None
    return str(own)


def bind_outgoing_connections(loop: asyncio.AbstractEventLoop, listen_host: str) -> bool:
    """Make every later ``loop.create_connection`` bind to ``listen_host`` where source_address_for says
    so.  Returns whether the listen host is usable as a source at all (False for 0.0.0.0, names, IPv6)."""
    if source_address_for(listen_host, "127.0.0.1") is None and source_address_for(listen_host, "10.0.0.1") is None:
        return False
    original = loop.create_connection

    async def create_connection(protocol_factory, host=None, port=None, *args, **kwargs):
        if kwargs.get("local_addr") is None and kwargs.get("sock") is None:
            source = source_address_for(listen_host, host)
            if source is not None:
                kwargs["local_addr"] = (source, 0)
        return await original(protocol_factory, host, port, *args, **kwargs)

    loop.create_connection = create_connection  # an instance attribute: only this node's loop
    return True
