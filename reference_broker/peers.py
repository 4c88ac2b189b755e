"""Node-to-node links: newline-delimited JSON over TCP on the node's own address.

Carries hints ("client X has new stored messages"), takeover kicks and live messages for subscribers
without a persistent session.  Everything sent here is best effort: a lost hint is recovered by the
connection's periodic re-check of its Redis queue, so a broken link costs latency, never messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("reference_broker.peers")


class Peers:
    def __init__(self, on_message: Callable[[dict[str, Any]], None]) -> None:
        self.on_message = on_message
        self.addresses: dict[str, str] = {}            # node id -> "host:port" (from the Redis registry)
        self._links: dict[str, asyncio.StreamWriter] = {}
        self._server: asyncio.base_events.Server | None = None
        self._readers: set[asyncio.Task] = set()

    async def start(self, host: str) -> str:
        self._server = await asyncio.start_server(self._serve, host, 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"{host}:{port}"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in self._links.values():
            writer.close()
        for task in list(self._readers):
            task.cancel()
        self._links.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._readers.add(task)
        try:
            while line := await reader.readline():
                try:
                    self.on_message(json.loads(line))
                except Exception:  # a bad message from a peer must not end the link
                    log.exception("bad peer message %r", line[:200])
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._readers.discard(task)
            writer.close()

    async def send(self, node_id: str, message: dict[str, Any]) -> bool:
        writer = self._links.get(node_id)
        try:
            if writer is None or writer.is_closing():
                address = self.addresses.get(node_id)
                if address is None:
                    return False
                host, _, port = address.rpartition(":")
                _, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), 2.0)
                self._links[node_id] = writer
            writer.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")
            if writer.transport.get_write_buffer_size() > 1 << 20:
                await writer.drain()
            return True
        except (TimeoutError, OSError) as error:
            log.debug("peer %s unreachable: %r", node_id, error)
            dead = self._links.pop(node_id, None)
            if dead is not None:
                with contextlib.suppress(Exception):
                    dead.close()
            return False
