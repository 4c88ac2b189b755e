"""The canonical form of the forwarded MQTT 5 properties (the history's ``props`` column) and the properties the
workload's publishers send."""

from __future__ import annotations

import json
from types import SimpleNamespace

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from contracts.mqtt_properties import WORKLOAD_USER_KEY, forwarded_json, workload_properties


def _paho(**values) -> Properties:
    properties = Properties(PacketTypes.PUBLISH)
    for name, value in values.items():
        for item in value if name == "UserProperty" else [value]:
            setattr(properties, name, item)
    return properties


def test_every_forwarded_property_in_canonical_form():
    text = forwarded_json(_paho(PayloadFormatIndicator=1, ContentType="text/plain", ResponseTopic="r/1",
                                CorrelationData=b"\x00\xffid", UserProperty=[("k", "2"), ("a", "1"), ("k", "1")]))
    assert text == ('{"content_type":"text/plain","correlation_data":"00ff6964","payload_format":1,'
                    '"response_topic":"r/1","user_properties":[["k","2"],["a","1"],["k","1"]]}')
    assert json.loads(text)["user_properties"][0] == ["k", "2"]  # wire order, not sorted


def test_only_present_keys_and_none_without_any():
    assert forwarded_json(_paho(ContentType="c")) == '{"content_type":"c"}'
    assert forwarded_json(_paho(PayloadFormatIndicator=0)) == '{"payload_format":0}'  # 0 is a value, not absence
    # the properties a broker does not forward unchanged are not part of it
    assert forwarded_json(_paho(MessageExpiryInterval=30)) is None
    assert forwarded_json(Properties(PacketTypes.PUBLISH)) is None
    assert forwarded_json(None) is None


def test_equal_strings_exactly_when_forwarded_unchanged():
    sent = _paho(ContentType="c", UserProperty=[("k", "1"), ("k", "2")])
    assert forwarded_json(sent) == forwarded_json(_paho(ContentType="c", UserProperty=[("k", "1"), ("k", "2")]))
    assert forwarded_json(sent) != forwarded_json(_paho(ContentType="c", UserProperty=[("k", "2"), ("k", "1")]))
    assert forwarded_json(sent) != forwarded_json(_paho(ContentType="c", UserProperty=[("k", "1")]))
    # what it reads is attributes: a paho Properties and anything shaped like one give the same string
    assert forwarded_json(SimpleNamespace(ContentType="c", UserProperty=[("k", "1"), ("k", "2")])) == \
        forwarded_json(sent)


def test_the_workload_properties_name_the_message_and_keep_one_key_twice():
    one, other = workload_properties("test_pub_client_0_0", 1), workload_properties("test_pub_client_0_0", 2)
    assert one.correlation_data == b"test_pub_client_0_0#1" and one != other
    assert [key for key, _ in one.user_properties] == [WORKLOAD_USER_KEY, WORKLOAD_USER_KEY]
    assert one.payload_format == 0  # the identity payload is binary, not UTF-8
    built = Properties(PacketTypes.PUBLISH)
    for name, value in one.attributes():
        setattr(built, name, value)
    decoded = Properties(PacketTypes.PUBLISH)
    decoded.unpack(built.pack())  # through the wire format and back: the same canonical string
    assert forwarded_json(decoded) == forwarded_json(built)
    assert json.loads(forwarded_json(built))["user_properties"] == [[WORKLOAD_USER_KEY, "first"],
                                                                    [WORKLOAD_USER_KEY, "second-1"]]
