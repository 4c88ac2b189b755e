"""The harness's subscriber keeps its QoS 2 session state across connections (docs/findings.md, session-mix
seeds 2 and 4): a message PUBREC'ed on one connection is handed over at the PUBREL that arrives on the next
(a fresh paho client), and a PUBREL for an unknown packet id is answered with PUBCOMP.  Real paho clients,
no socket: the PUBREL is fed to paho's own packet handler."""

from __future__ import annotations

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from harness.clients import NonBlockingConnectClient, take_unreleased_qos2


def _client() -> NonBlockingConnectClient:
    client = NonBlockingConnectClient(CallbackAPIVersion.VERSION2, client_id="s", protocol=mqtt.MQTTv311,
                                      clean_session=False)
    client.manual_ack_set(True)
    return client


def _pubrec_ed(client: mqtt.Client, mid: int, qos: int = 2) -> mqtt.MQTTMessage:
    # what paho's _handle_publish keeps after it sent PUBREC for a QoS 2 PUBLISH
    message = mqtt.MQTTMessage(mid=mid, topic=b"europe/ua/kyiv/0/0")
    message.qos, message.payload, message.state = qos, b"x", mqtt.mqtt_ms_wait_for_pubrel
    client._in_messages[mid] = message
    return message


def _feed_pubrel(client: mqtt.Client, mid: int) -> tuple[list[int], list[int]]:
    delivered: list[int] = []
    pubcomps: list[int] = []
    client.on_message = lambda c, u, m: delivered.append(m.mid)
    client._send_pubcomp = lambda m: pubcomps.append(m) or mqtt.MQTTErrorCode.MQTT_ERR_SUCCESS
    client._in_packet = {"command": 0x62, "packet": mid.to_bytes(2, "big")}
    assert client._handle_pubrel() == mqtt.MQTTErrorCode.MQTT_ERR_SUCCESS
    return delivered, pubcomps


def test_pubrec_ed_message_is_released_on_the_next_connection():
    old, new = _client(), _client()
    _pubrec_ed(old, 24)
    _pubrec_ed(old, 7, qos=1)  # not part of the QoS 2 state: never carried
    carried = take_unreleased_qos2(old)
    assert sorted(carried) == [24] and 24 not in old._in_messages
    new._in_messages.update(carried)
    delivered, pubcomps = _feed_pubrel(new, 24)
    # handed to the application, which sends the PUBCOMP itself (manual ack): paho sends none
    assert delivered == [24] and pubcomps == []


def test_unknown_pubrel_is_answered_with_pubcomp():
    # failed before the fix: paho 2.x with manual_ack sent nothing and the broker's QoS 2 flow stayed open
    delivered, pubcomps = _feed_pubrel(_client(), 24)
    assert delivered == [] and pubcomps == [24]


def test_nothing_to_take_from_no_client():
    assert take_unreleased_qos2(None) == {}
