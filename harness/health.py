"""Health of a started topology, as ``ordeal up --check`` reports it: Redis Cluster ready by the full
definition (harness/running_redis_cluster.py) and a Kafka produce → consume → commit round trip."""

from __future__ import annotations

import asyncio
import time
import uuid

from contracts.topology import ServiceTopology
from harness.node import port_accepts


async def kafka_round_trip(bootstrap: str, timeout_s: float = 20.0) -> dict:
    """Produce one record (acks=all), consume it back, commit its offset, read the commit back.
    Uses manual partition assignment: a group commit without the (slow) group join of Tansu."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    topic, group = f"ordeal-check-{uuid.uuid4().hex[:8]}", f"ordeal-check-{uuid.uuid4().hex[:8]}"
    value = uuid.uuid4().bytes
    timings: dict[str, float] = {}
    began = time.monotonic()
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        await admin.close()
    timings["create_topic_s"] = time.monotonic() - began

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False)
    await producer.start()
    try:
        sent = await asyncio.wait_for(producer.send_and_wait(topic, value), timeout_s)
    finally:
        await producer.stop()
    timings["produce_s"] = time.monotonic() - began

    partition = TopicPartition(topic, 0)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
                                auto_offset_reset="earliest")
    await consumer.start()
    try:
        consumer.assign([partition])
        await consumer.seek_to_beginning(partition)
        record = await asyncio.wait_for(consumer.getone(), timeout_s)
        await consumer.commit({partition: record.offset + 1})
        committed = await consumer.committed(partition)
    finally:
        await consumer.stop()
    timings["consume_commit_s"] = time.monotonic() - began
    ok = record.value == value and record.offset == sent.offset and committed == record.offset + 1
    return {"ok": ok, "topic": topic, "offset": record.offset, "committed": committed,
            "value_matches": record.value == value, **{k: round(v, 3) for k, v in timings.items()}}


def check(topology: ServiceTopology) -> dict:
    """A JSON-able summary; ``healthy`` is True only when every part answered correctly."""
    summary: dict = {"timings": dict(topology.timings)}
    began = time.monotonic()
    health = topology.redis.health()
    summary["redis"] = {"ok": health.ok, "masters": health.masters, "replicas": health.replicas,
                        "problems": list(health.problems), "check_s": round(time.monotonic() - began, 3)}
    if topology.kafka is not None:
        try:
            summary["kafka"] = asyncio.run(kafka_round_trip(topology.kafka_bootstrap()))
        except Exception as error:  # noqa: BLE001 - reported as unhealthy with the reason
            summary["kafka"] = {"ok": False, "error": f"{type(error).__name__}: {error}"}
    if topology.brokers:
        down = [b.name for b in topology.brokers if not (b.is_alive() and port_accepts(b.host, b.port))]
        summary["brokers"] = {"ok": not down, "nodes": {b.name: b.address for b in topology.brokers},
                              "not_serving": down}
    summary["healthy"] = all(part["ok"] for key, part in summary.items() if key in ("redis", "kafka", "brokers"))
    return summary
