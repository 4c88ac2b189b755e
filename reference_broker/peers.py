"""Node-to-node links: newline-delimited JSON over TCP on the node's own address.

Carries hints ("client X has new stored messages"), takeover kicks and live messages for subscribers
without a persistent session.  Everything sent here is best effort and never blocks the caller: each peer
has a bounded outbox drained by its own task, so a dead, paused or partitioned node costs nothing but its
own messages.  A lost hint is recovered by the connection's periodic re-check of its Redis queue, so a
broken link costs latency, never stored messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("reference_broker.peers")

OUTBOX_LIMIT = 10000      # per peer; beyond it messages are dropped (best effort)
CONNECT_TIMEOUT_S = 2.0
RETRY_AFTER_S = 1.0       # after a failed connect, drop messages for this long instead of queueing


class Peers:
    def __init__(self, on_message: Callable[[dict[str, Any]], None]) -> None:
        self.on_message = on_message
        self.addresses: dict[str, str] = {}            # node id -> "host:port" (from the Redis registry)
        self._outboxes: dict[str, asyncio.Queue] = {}
        self._senders: dict[str, asyncio.Task] = {}
        self._down_until: dict[str, float] = {}
        self._server: asyncio.base_events.Server | None = None
        self._readers: set[asyncio.Task] = set()
        self.dropped = 0

    async def start(self, host: str) -> str:
        self._server = await asyncio.start_server(self._serve, host, 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"{host}:{port}"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in [*self._senders.values(), *self._readers]:
            task.cancel()
        self._senders.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._readers.add(task)
        try:
            while line := await reader.readline():
                try:
                    self.on_message(json.loads(line))
                except Exception:  # a bad message from a peer must not end the link
                    log.exception("bad peer message %r", line[:200])
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # the peer went away, or this node stops (a re-raised cancel would be logged as an error)
        finally:
            self._readers.discard(task)
            writer.close()

    def post(self, node_id: str, message: dict[str, Any]) -> bool:
        """Queue a message for a peer; returns False if it was dropped (unknown, down or backed up)."""
        loop = asyncio.get_running_loop()
        if node_id not in self.addresses or self._down_until.get(node_id, 0) > loop.time():
            self.dropped += 1
            return False
        outbox = self._outboxes.get(node_id)
        if outbox is None:
            outbox = self._outboxes[node_id] = asyncio.Queue(OUTBOX_LIMIT)
        if node_id not in self._senders or self._senders[node_id].done():
            self._senders[node_id] = loop.create_task(self._sender(node_id, outbox))
        try:
            outbox.put_nowait(message)
            return True
        except asyncio.QueueFull:
            self.dropped += 1
            return False

    async def _sender(self, node_id: str, outbox: asyncio.Queue) -> None:
        writer = None
        try:
            while True:
                message = await outbox.get()
                try:
                    if writer is None or writer.is_closing():
                        host, _, port = self.addresses[node_id].rpartition(":")
                        _, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)),
                                                           CONNECT_TIMEOUT_S)
                    batch = [message]
                    while not outbox.empty() and len(batch) < 500:
                        batch.append(outbox.get_nowait())
                    writer.write(b"".join(json.dumps(m, separators=(",", ":")).encode() + b"\n" for m in batch))
                    await asyncio.wait_for(writer.drain(), CONNECT_TIMEOUT_S)
                except (TimeoutError, OSError, KeyError) as error:
                    # the peer is gone or unreachable: drop what is queued, refuse new posts for a while
                    log.debug("peer %s unreachable: %r", node_id, error)
                    self._down_until[node_id] = asyncio.get_running_loop().time() + RETRY_AFTER_S
                    self.dropped += outbox.qsize() + 1
                    while not outbox.empty():
                        outbox.get_nowait()
                    if writer is not None:
                        with contextlib.suppress(Exception):
                            writer.close()
                    writer = None
        finally:
            if writer is not None:
                with contextlib.suppress(Exception):
                    writer.close()
