"""Lua script calls made in one turn of the event loop leave as one pipeline per Redis master.

Per delivered message the broker runs a few small scripts (save, read the backlog, remove on PUBACK), each
from its own task: the persister saves every client of a poll at once, the delivery loops it wakes read at
once, and the PUBACKs that one epoll turn brings are handled at once.  Sent one by one, each is a
``socket.send`` and a reply read of its own, and those syscalls dominate the broker's CPU (each also wakes
Redis separately; benchmarks/broker_p2p.py profiles it).  Here a call queues its EVALSHA and the queue
is sent at the end of the turn, grouped by the master owning each key's slot, one write per master.

What is not sent as asked goes the ordinary way (``AsyncScript.__call__``, which follows MOVED/ASK and
reloads a missing script): a reply of NOSCRIPT or a redirection means the script did not run.  A failed
connection fails every call of its pipeline, as it fails a single call (the callers retry; whether the
script ran is as unknown as it is for a single call)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from redis.asyncio.cluster import PipelineCommand, RedisCluster
from redis.commands.core import AsyncScript
from redis.exceptions import AskError, NoScriptError


class ScriptBatcher:
    def __init__(self, redis: RedisCluster) -> None:
        self.redis = redis
        self._pending: list[tuple[AsyncScript, list[Any], list[Any], asyncio.Future]] = []
        self._scheduled = False
        self._tasks: set[asyncio.Task] = set()  # the loop keeps only weak references to running tasks
        self.pipelines = 0   # pipelines sent (for the benchmark's counters)
        self.calls = 0       # script calls made through them

    def call(self, script: AsyncScript, keys: list[Any], args: list[Any]) -> asyncio.Future:
        """Queue ``script(keys, args)``; the future gets its reply (or its error)."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._pending.append((script, keys, args, future))
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)
        return future

    def _flush(self) -> None:
        self._scheduled = False
        batch, self._pending = self._pending, []
        by_node: dict[str, list] = {}
        nodes = {}
        for item in batch:
            try:
                node = self.redis.get_node_from_key(item[1][0])
            except Exception:  # slot map not usable right now: the ordinary path copes
                self._start(self._direct(item))
                continue
            nodes[node.name] = node
            by_node.setdefault(node.name, []).append(item)
        for name, items in by_node.items():
            self._start(self._send(nodes[name], items))

    def _start(self, coroutine) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, node, items: list) -> None:
        commands = [PipelineCommand(i, "EVALSHA", script.sha, len(keys), *keys, *args)
                    for i, (script, keys, args, _) in enumerate(items)]
        self.pipelines += 1
        self.calls += len(items)
        try:
            await node.execute_pipeline(commands)
        except Exception as error:
            for *_, future in items:
                if not future.done():
                    future.set_exception(error)
            with contextlib.suppress(Exception):
                await self.redis.nodes_manager.initialize()  # the node may be gone: refresh the slot map
            return
        for command, item in zip(commands, items, strict=True):
            result, future = command.result, item[3]
            if isinstance(result, (NoScriptError, AskError)):
                # not run: a restarted/failed-over master without the script, or the slot moved
                await self._direct(item)
            elif future.done():
                continue  # the caller gave up (cancelled)
            elif isinstance(result, Exception):
                future.set_exception(result)
            else:
                future.set_result(result)

    @staticmethod
    async def _direct(item) -> None:
        script, keys, args, future = item
        try:
            result = await script(keys=keys, args=args)
        except Exception as error:
            if not future.done():
                future.set_exception(error)
            return
        if not future.done():
            future.set_result(result)
