"""reference_broker/script_batch.py against the real Redis Cluster of the shared topology: script calls of one
event-loop turn leave as one pipeline per master, each caller gets its own reply or error, and a call the
pipeline could not run (NOSCRIPT after SCRIPT FLUSH) still runs, the ordinary way."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.exceptions import ResponseError

from reference_broker.script_batch import ScriptBatcher

pytestmark = pytest.mark.integration

ECHO = "return {KEYS[1], ARGV[1]}"
FAIL = "return redis.error_reply('planted failure ' .. ARGV[1])"


def run(topology, body):
    async def main():
        redis = RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in topology.redis_startup_nodes()])
        await redis.initialize()
        try:
            return await body(redis)
        finally:
            await redis.aclose()
    return asyncio.run(main())


def test_one_turn_is_one_pipeline_per_master_and_each_caller_gets_its_reply(topology):
    async def body(redis):
        echo = redis.register_script(ECHO)
        await echo(keys=["{warm}"], args=["x"])  # loaded where that key lives; other masters answer NOSCRIPT
        batch = ScriptBatcher(redis)
        keys = [f"{{k{uuid.uuid4().hex[:6]}-{i}}}" for i in range(60)]
        replies = await asyncio.gather(*(batch.call(echo, [k], [str(i)]) for i, k in enumerate(keys)))
        masters = {redis.get_node_from_key(k).name for k in keys}
        return keys, replies, masters, batch

    keys, replies, masters, batch = run(topology, body)
    assert [[r.decode() for r in reply] for reply in replies] == [[k, str(i)] for i, k in enumerate(keys)]
    assert batch.calls == 60
    assert batch.pipelines == len(masters) > 1, (batch.pipelines, masters)


def test_a_script_missing_on_a_master_still_runs(topology):
    async def body(redis):
        echo = redis.register_script(ECHO)
        await redis.execute_command("SCRIPT FLUSH", target_nodes=RedisCluster.PRIMARIES)  # NOSCRIPT everywhere now
        batch = ScriptBatcher(redis)
        return await asyncio.gather(*(batch.call(echo, [f"{{n{i}}}"], [str(i)]) for i in range(10)))

    replies = run(topology, body)
    assert [[r.decode() for r in reply] for reply in replies] == [[f"{{n{i}}}", str(i)] for i in range(10)]


def test_an_error_reply_goes_to_its_own_caller_only(topology):
    async def body(redis):
        echo, fail = redis.register_script(ECHO), redis.register_script(FAIL)
        batch = ScriptBatcher(redis)
        return await asyncio.gather(batch.call(echo, ["{e}"], ["a"]), batch.call(fail, ["{e}"], ["b"]),
                                    batch.call(echo, ["{e}"], ["c"]), return_exceptions=True)

    first, failed, last = run(topology, body)
    assert [r.decode() for r in first] == ["{e}", "a"] and [r.decode() for r in last] == ["{e}", "c"]
    assert isinstance(failed, ResponseError) and "planted failure b" in str(failed)
