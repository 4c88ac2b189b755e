"""The MQTT part of ``ordeal up --check``: one QoS 1 message through the reference brokers, from a
publisher on one node to a persistent subscriber on another that is offline when the message is
published, so it must come from the subscriber's stored session (Kafka -> Redis -> delivery)."""

from __future__ import annotations

import time
import uuid

from harness.recording_client import Probe


def mqtt_round_trip(publish_to: tuple[str, int], subscribe_on: tuple[str, int], timeout_s: float = 20.0) -> dict:
    """Subscribe (persistent, MQTT 5), go offline, publish QoS 1 elsewhere, reconnect and expect the
    message with session present.  The subscriber's session is removed at the end (clean start).
    Returns a JSON-able dict with ``ok`` and timings; raises TimeoutError / ConnectionError / OSError
    when a node does not answer."""
    tag = uuid.uuid4().hex[:8]
    topic, payload = f"ordeal/check/{tag}", f"check-{tag}".encode()
    sub_id, pub_id = f"ordeal-check-sub-{tag}", f"ordeal-check-pub-{tag}"
    began = time.monotonic()
    timings: dict[str, float] = {}
    subscriber = Probe(*subscribe_on, sub_id, version=5)
    publisher = Probe(*publish_to, pub_id, version=5)
    try:
        subscriber.connect(clean=True, session_expiry=300, timeout=timeout_s)
        subscriber.subscribe(topic, 1, timeout=timeout_s)
        subscriber.disconnect()
        timings["subscribed_s"] = time.monotonic() - began
        publisher.connect(clean=True, timeout=timeout_s)
        publisher.publish(topic, payload, 1, timeout=timeout_s)   # PUBACK: Kafka has it
        publisher.disconnect()
        timings["puback_s"] = time.monotonic() - began
        session_present = subscriber.connect(clean=False, session_expiry=300, timeout=timeout_s)
        deliveries = subscriber.wait_for(1, timeout_s)
        timings["delivered_s"] = time.monotonic() - began
        subscriber.settle(0.3, timeout=2)
        received = [d.payload for d in subscriber.deliveries]
    finally:
        publisher.drop()
        subscriber.drop()
    # remove the check's session: clean start, session expiry 0, DISCONNECT
    with_cleanup = Probe(*subscribe_on, sub_id, version=5)
    try:
        with_cleanup.connect(clean=True, session_expiry=0, timeout=timeout_s)
        with_cleanup.disconnect()
    finally:
        with_cleanup.drop()
    ok = session_present and received == [payload] and bool(deliveries) and deliveries[0].qos == 1
    return {"ok": ok, "publish_to": f"{publish_to[0]}:{publish_to[1]}",
            "subscribe_on": f"{subscribe_on[0]}:{subscribe_on[1]}", "topic": topic,
            "session_present": session_present, "received": [p.decode(errors="replace") for p in received],
            **{k: round(v, 3) for k, v in timings.items()}}
