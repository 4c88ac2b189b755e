"""Kafka and its S3 bucket as both providers use them: the bucket Tansu keeps its log in (readiness of the
S3 server, the bucket's creation), topic creation, and reading the broker's topics back to their end with
its committed offsets (the Kafka backlog a drain explains missing deliveries with).  The local Tansu and S3
processes: harness/local/tansu.py."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from contracts.topology import NodeHandle
from harness.node import NodeError

BUCKET = "tansu"
MOTO_KEYS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}


def _s3_answers(node: NodeHandle) -> bool:
    try:
        urllib.request.urlopen(f"http://{node.host}:{node.port}/", timeout=0.5).close()
        return True
    except urllib.error.HTTPError:
        return True  # any HTTP answer (403, 404...) means the server is serving
    except OSError:
        return False


def _create_bucket(node: NodeHandle) -> None:
    request = urllib.request.Request(f"http://{node.host}:{node.port}/{BUCKET}", method="PUT")
    try:
        urllib.request.urlopen(request, timeout=5).close()
    except urllib.error.HTTPError as error:
        if error.code != 409:  # already exists
            raise NodeError(f"{node.name}: creating bucket {BUCKET!r} failed: HTTP {error.code}") from error


async def create_topics_async(bootstrap: str, topics: Mapping[str, int], timeout_s: float = 30.0) -> None:
    """Create topics {name: partitions}; existing topics are left as they are."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import TopicAlreadyExistsError

    for name, partitions in topics.items():
        if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1:
            raise ValueError(f"topic {name!r}: partitions = {partitions!r}, expected an integer >= 1")
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout_s * 1000))
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        wanted = [NewTopic(name, partitions, 1) for name, partitions in topics.items() if name not in existing]
        if wanted:
            response = await admin.create_topics(wanted)
            for name, code, *_ in getattr(response, "topic_errors", getattr(response, "topics", [])):
                if code not in (0, TopicAlreadyExistsError.errno):
                    raise NodeError(f"kafka: creating topic {name!r} failed with error code {code}")
    finally:
        await admin.close()


def create_topics(bootstrap: str, topics: Mapping[str, int], timeout_s: float = 30.0) -> None:
    asyncio.run(create_topics_async(bootstrap, topics, timeout_s))


async def topic_backlog_async(bootstrap: str, topic: str, group: str, *, idle_s: float = 5.0,
                              first_wait_s: float = 15.0, timeout_s: float = 60.0) -> dict[str, Any]:
    """What the topic holds and what ``group`` has not consumed yet: every record read from the beginning
    by a group-less consumer until ``idle_s`` passes without a new one (ListOffsets "latest" is short in
    this Tansu build, so the end is found by reading, not asked), and the group's committed offsets.
    Returns {"records": {partition: [(offset, value bytes)]}, "committed": {partition: offset or None}}."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    records: dict[int, list[tuple[int, bytes]]] = {}
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                                auto_offset_reset="earliest", request_timeout_ms=int(timeout_s * 1000))
    await consumer.start()
    try:
        await consumer.topics()  # fills the metadata, so the partitions are known
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        loop = asyncio.get_running_loop()
        deadline, last_new = loop.time() + timeout_s, loop.time()
        # The end of the log is "nothing new for idle_s" once records flow; before the first record the
        # wait is first_wait_s: on a loaded machine the first fetch of a long log took longer than idle_s,
        # and an empty read must never pass for an empty topic.
        while loop.time() < deadline and loop.time() - last_new < (idle_s if records else first_wait_s):
            batch = await consumer.getmany(timeout_ms=500)
            for tp, got in batch.items():
                records.setdefault(tp.partition, []).extend((r.offset, r.value) for r in got)
                last_new = loop.time()
    finally:
        await consumer.stop()
    # The group's committed offsets through a consumer of that group that never joins it (committed() only
    # asks the coordinator); this Tansu build answers the admin client's OffsetFetch in a form aiokafka
    # cannot decode.
    reader = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
                              request_timeout_ms=int(timeout_s * 1000))
    await reader.start()
    try:
        committed: dict[int, int | None] = {}
        for tp in partitions:
            offset = await reader.committed(tp)
            committed[tp.partition] = offset if offset is not None and offset >= 0 else None
    finally:
        await reader.stop()
    return {"records": records, "committed": committed}


def topic_backlog(bootstrap: str, topic: str, group: str, **kwargs: float) -> dict[str, Any]:
    return asyncio.run(topic_backlog_async(bootstrap, topic, group, **kwargs))


def topics_backlog(bootstrap: str, groups: Mapping[str, str], **kwargs: float) -> dict[str, dict[str, Any]]:
    """topic_backlog() of several topics ({topic: group}) at once; a topic that cannot be read gets
    {"error": ...} (a diagnostic must never break a run)."""

    async def read_all() -> list[Any]:
        return await asyncio.gather(*(topic_backlog_async(bootstrap, topic, group, **kwargs)
                                      for topic, group in groups.items()), return_exceptions=True)

    results = asyncio.run(read_all())
    return {topic: (result if not isinstance(result, BaseException)
                    else {"error": f"{type(result).__name__}: {result}"})
            for topic, result in zip(groups, results, strict=True)}


def record_identity(value: bytes | None) -> tuple[str, int] | None:
    """(publisher client id, sequence) of a reference-broker record (JSON with "publisher" and a base64
    "payload" carrying an Ordeal identity, contracts/payload.py), or None for anything else."""
    import base64
    import json

    from contracts.payload import try_decode

    try:
        message = json.loads(value or b"")
        identity = try_decode(base64.b64decode(message["payload"]))
    except (ValueError, KeyError, TypeError):
        return None
    return (str(message.get("publisher")), identity.seq) if identity is not None else None


def backlog_summary(reads: Mapping[str, Mapping[str, Any]], acked: set[tuple[str, int]]) -> dict[str, Any]:
    """Where the acknowledged publishes are at the end of a run, per topic (``reads``: topic ->
    topic_backlog() result).  Per topic: records held, records past the group's committed offset
    (``unconsumed``: still in the pipeline).  With ``acked`` (publisher, seq) of every acknowledged
    publish: how many are nowhere in the topic (``acked_missing``: the Kafka stand-in lost them, or the
    broker acknowledged without producing) and how many sit unconsumed (``acked_unconsumed``)."""
    summary: dict[str, Any] = {}
    for topic, read in reads.items():
        held, unconsumed, present, waiting = _scan(read)
        if not read_is_complete(read):  # acknowledged publishes exist: a short read says nothing
            summary[topic] = {"records": held, "error": "read short of the committed offsets (Kafka too slow "
                                                        "or unreadable): no conclusion"}
            continue
        summary[topic] = {"records": held, "unconsumed": unconsumed,
                          "acked_missing": len(acked - present), "acked_unconsumed": len(acked & waiting),
                          "acked_missing_first": sorted(acked - present)[:20]}
    return summary


def owed_in_backlog(reads: Mapping[str, Mapping[str, Any]], owed: set[tuple[str, int]]) -> int | None:
    """How many of the ``owed`` (publisher, seq) still sit in some topic past its group's committed
    offset (the broker has not finished them); None when no topic could be read."""
    # a topic read empty or short of its committed offsets is unreadable, not empty: owed records were
    # acknowledged, so Kafka had them
    readable = [read for read in reads.values() if "error" not in read and read_is_complete(read)]
    if not readable:
        return None
    waiting: set[tuple[str, int]] = set()
    for read in readable:
        waiting |= _scan(read)[3]
    return len(waiting & owed)


def read_is_complete(read: Mapping[str, Any]) -> bool:
    """False when the read is certainly partial: nothing read, or a partition read short of the offset the
    group already committed (the end itself cannot be asked of this Tansu build, only this bound)."""
    if not any(read["records"].values()):
        return False
    for partition, committed in read["committed"].items():
        records = read["records"].get(partition, [])
        last = max((offset for offset, _value in records), default=-1)
        if committed is not None and last + 1 < committed:
            return False
    return True


def _scan(read: Mapping[str, Any]) -> tuple[int, int, set[tuple[str, int]], set[tuple[str, int]]]:
    """One pass over a topic read: (records held, records past the group's committed offset, identities
    present, identities not yet consumed)."""
    present: set[tuple[str, int]] = set()
    waiting: set[tuple[str, int]] = set()
    held = unconsumed = 0
    for partition, records in read["records"].items():
        committed = read["committed"].get(partition)
        for offset, value in records:
            held += 1
            beyond = committed is None or offset >= committed
            unconsumed += beyond
            identity = record_identity(value)
            if identity is not None:
                present.add(identity)
                if beyond:
                    waiting.add(identity)
    return held, unconsumed, present, waiting
