"""Tansu on S3 storage, with real processes: acknowledged records and committed offsets survive kills."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from harness.local.host_topology import LocalTopology
from harness.topology_config import TopologyConfig

pytestmark = pytest.mark.integration

TOPIC, GROUP, PARTITIONS, RECORDS = "survival", "survivors", 2, 200


async def _produce(bootstrap: str, count: int, start: int = 0) -> dict[int, list[bytes]]:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False,
                                linger_ms=5)
    await producer.start()
    acked: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    try:
        futures = [(i, await producer.send(TOPIC, f"record-{i}".encode(), partition=i % PARTITIONS))
                   for i in range(start, start + count)]
        for i, future in futures:
            metadata = await future  # acked by the broker (acks=all)
            acked[metadata.partition].append(f"record-{i}".encode())
    finally:
        await producer.stop()
    return acked


async def _read(bootstrap: str, partition: int, *, from_committed: bool, limit: int | None = None,
                commit: bool = False) -> tuple[list[bytes], int | None]:
    """Read one partition (manual assignment, the group only stores offsets), optionally committing."""
    tp = TopicPartition(TOPIC, partition)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=GROUP, enable_auto_commit=False,
                                auto_offset_reset="earliest")
    await consumer.start()
    values: list[bytes] = []
    try:
        consumer.assign([tp])
        committed = await consumer.committed(tp)
        if from_committed and committed is not None:
            consumer.seek(tp, committed)
        else:
            await consumer.seek_to_beginning(tp)
        deadline = time.monotonic() + 10
        while (limit is None or len(values) < limit) and time.monotonic() < deadline:
            batch = await consumer.getmany(tp, timeout_ms=500, max_records=limit and limit - len(values))
            records = batch.get(tp, [])
            if not records and limit is None:
                break  # nothing more arrives: the partition is drained
            for record in records:
                values.append(record.value)
                if commit:
                    await consumer.commit({tp: record.offset + 1})
        return values, await consumer.committed(tp)
    finally:
        await consumer.stop()


@pytest.mark.parametrize("storage", ["s3rver", "moto"])
def test_acked_records_and_committed_offsets_survive_kills(topology_factory, storage: str) -> None:
    topology: LocalTopology = topology_factory(TopologyConfig(kafka_storage=storage))
    assert topology.endpoints()["storage"]["kind"] == storage
    disk_backed = storage == "s3rver"
    topology.create_topics({TOPIC: PARTITIONS})
    bootstrap = topology.kafka_bootstrap()
    acked = asyncio.run(_produce(bootstrap, RECORDS))
    assert sum(map(len, acked.values())) == RECORDS
    consumed, committed = asyncio.run(_read(bootstrap, 0, from_committed=True, limit=30, commit=True))
    assert consumed == acked[0][:30] and committed == 30

    killed_at = time.monotonic()
    topology.kafka.kill()
    assert not topology.kafka.is_alive()
    topology.kafka.start()
    topology.kafka.wait_ready(30)
    restart_s = time.monotonic() - killed_at

    for partition in range(PARTITIONS):  # every acknowledged record is still there, in order
        values, _ = asyncio.run(_read(bootstrap, partition, from_committed=False))
        assert values == acked[partition], f"partition {partition} after SIGKILL + restart of Tansu"
    rest, committed = asyncio.run(_read(bootstrap, 0, from_committed=True))
    assert committed == 30, "the committed offset survived"
    assert rest == acked[0][30:]
    more = asyncio.run(_produce(bootstrap, 10, start=RECORDS))  # and it takes writes again
    assert sum(map(len, more.values())) == 10
    print(f"\nTansu SIGKILL -> restarted and serving: {restart_s:.2f} s "
          f"(storage: {topology.endpoints()['storage']['kind']})")

    if disk_backed:  # s3rver keeps the bucket on disk: killing the storage server too loses nothing
        topology.kafka.kill()
        topology.storage.kill()
        topology.storage.start()
        topology.storage.wait_ready(30)
        topology.kafka.start()
        topology.kafka.wait_ready(30)
        values, committed = asyncio.run(_read(bootstrap, 1, from_committed=False))
        assert values == acked[1] + more[1]
        _, committed = asyncio.run(_read(bootstrap, 0, from_committed=True, limit=0))
        assert committed == 30


def test_topic_creation_with_partition_counts(topology: LocalTopology) -> None:
    topology.create_topics({"ordeal-three": 3, "ordeal-one": 1})
    topology.create_topics({"ordeal-three": 3})  # existing: left alone, no error

    async def partitions() -> dict[str, int]:
        consumer = AIOKafkaConsumer(bootstrap_servers=topology.kafka_bootstrap())
        await consumer.start()
        try:
            await consumer.topics()  # fetches the cluster metadata
            return {t: len(consumer.partitions_for_topic(t) or ()) for t in ("ordeal-three", "ordeal-one")}
        finally:
            await consumer.stop()

    assert asyncio.run(partitions()) == {"ordeal-three": 3, "ordeal-one": 1}
    with pytest.raises(ValueError, match="partitions"):
        topology.create_topics({"bad": 0})


def test_memory_storage_really_loses_records_on_kill(topology_factory) -> None:
    """The control for the survival test above: without S3 storage the same kill loses the log, so the
    survival test does measure the storage and can fail."""
    topology: LocalTopology = topology_factory(TopologyConfig(kafka_storage="memory"))
    assert topology.storage is None
    topology.create_topics({TOPIC: PARTITIONS})
    acked = asyncio.run(_produce(topology.kafka_bootstrap(), 20))
    assert sum(map(len, acked.values())) == 20
    topology.kafka.kill()
    topology.kafka.start()
    topology.kafka.wait_ready(30)
    topology.create_topics({TOPIC: PARTITIONS})
    values, _ = asyncio.run(_read(topology.kafka_bootstrap(), 0, from_committed=False))
    assert values != acked[0]


async def _produce_until(bootstrap: str, topic: str, name: str, stop: asyncio.Event) -> set[bytes]:
    """One producer sending one record at a time (acks=all) until ``stop``; returns the acknowledged values.
    Errors while Tansu is down are expected: such a record is not acknowledged (it may or may not exist)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False,
                                request_timeout_ms=5000, retry_backoff_ms=100)
    await producer.start()
    acked: set[bytes] = set()
    try:
        sequence = 0
        while not stop.is_set():
            value = f"{name}-{sequence}".encode()
            sequence += 1
            try:
                await producer.send_and_wait(topic, value, partition=sequence % 2)
                acked.add(value)
            except Exception:  # noqa: BLE001 - Tansu is down: not acknowledged, go on
                await asyncio.sleep(0.1)
    finally:
        await producer.stop()
    return acked


def test_sigkill_under_two_concurrent_producers_loses_no_acknowledged_record(topology_factory) -> None:
    """The question kafka-broker-kill used to answer with an allowance: on the default storage (moto, which
    honours S3 conditional writes) Tansu is SIGKILLed while two producers append to the same partitions,
    restarted, and every record it acknowledged — before, around and after the kill — is read back."""
    from harness.kafka import topic_backlog

    topology: LocalTopology = topology_factory(TopologyConfig(redis_replicas_per_master=0))
    assert topology.endpoints()["storage"]["kind"] == "moto"
    topic = "kill-under-load"
    topology.create_topics({topic: 2})
    bootstrap = topology.kafka_bootstrap()

    async def scenario() -> set[bytes]:
        stop = asyncio.Event()
        producers = [asyncio.create_task(_produce_until(bootstrap, topic, name, stop)) for name in ("a", "b")]
        await asyncio.sleep(2.0)
        topology.kafka.kill()  # mid-stream: both producers have sends in flight
        await asyncio.sleep(1.0)
        await asyncio.get_running_loop().run_in_executor(None, lambda: (topology.kafka.start(),
                                                                        topology.kafka.wait_ready(30)))
        await asyncio.sleep(3.0)
        stop.set()
        return set().union(*await asyncio.gather(*producers))

    acked = asyncio.run(scenario())
    read = topic_backlog(bootstrap, topic, "nobody")
    values = [value for records in read["records"].values() for _offset, value in records]
    assert {v[:1] for v in acked} == {b"a", b"b"} and len(acked) > 20, len(acked)  # both really produced
    missing = acked - set(values)
    print(f"\nTansu SIGKILL under two producers (moto): {len(acked)} acknowledged, {len(missing)} missing, "
          f"{len(values) - len(set(values))} read twice")
    # (An offset handed out twice — s3rver's failure — shows up here as a lost record.  A record read twice
    # is legal: a non-idempotent producer retries a send whose answer died with Tansu; measured: 1 of 639.)
    assert not missing, f"{len(missing)} of {len(acked)} acknowledged records lost: {sorted(missing)[:10]}"
