"""CONNACK codes in words: MQTT 3.1.1's return codes (§3.2.2.3) and MQTT 5's reason codes (§3.2.2.2), and which
of them say the broker refused the client's credentials.  One vocabulary for the readiness probe
(harness/mqtt_probe.py), the workload clients (harness/clients.py) and the run's outcome."""

from __future__ import annotations

from paho.mqtt.client import convert_connack_rc_to_reason_code
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.reasoncodes import ReasonCode

RETURN_CODES_311 = {
    0: "connection accepted",
    1: "unacceptable protocol version",
    2: "identifier rejected",
    3: "server unavailable",
    4: "bad user name or password",
    5: "not authorized",
}
# The refusals that are about the client's credentials, per protocol level (4 = 3.1.1, 5 = MQTT 5).
AUTH_REFUSALS = {4: frozenset({4, 5}), 5: frozenset({0x86, 0x87, 0x8C})}
# paho-mqtt reports a 3.1.1 CONNACK as the MQTT 5 reason code of the same name; its own conversion, read
# backwards, gives the 3.1.1 return code on the wire.
_PAHO_NAMES_311 = {convert_connack_rc_to_reason_code(rc).getName(): rc for rc in RETURN_CODES_311}


def _reason_words(code: int) -> str:
    """MQTT 5's name of a CONNACK reason code (§3.2.2.2), as paho-mqtt knows it."""
    try:
        return ReasonCode(PacketTypes.CONNACK, identifier=code).getName().lower()
    except KeyError:
        return "reason code not defined by MQTT 5"


def words(level: int, code: int) -> str:
    """'not authorized (CONNACK 5)' (3.1.1) / 'not authorized (CONNACK 0x87)' (MQTT 5)."""
    if level == 5:
        return f"{_reason_words(code)} (CONNACK 0x{code:02X})"
    return f"{RETURN_CODES_311.get(code, 'return code not defined by MQTT 3.1.1')} (CONNACK {code})"


def is_auth_refusal(level: int, code: int) -> bool:
    return code in AUTH_REFUSALS.get(level, frozenset())


def wire_code(level: int, paho_reason_name: str, paho_value: int) -> int:
    """The code the broker sent: paho's reason code on MQTT 5; on 3.1.1 the return code paho renamed."""
    if level == 5:
        return paho_value
    return _PAHO_NAMES_311.get(paho_reason_name, paho_value)


def refusal_message(broker: str, client_id: str, level: int, code: int, username: str | None,
                    with_password: bool) -> str:
    """The run's outcome when the broker refuses a client's credentials (the run ends unknown): who, what the
    broker answered, and what the client sent (never the password)."""
    if username is None:
        sent = "no credentials (anonymous)"
    else:
        sent = f"user name {username!r} " + ("and a password" if with_password else "without a password")
    return (f"{broker} refused the CONNECT of {client_id}: {words(level, code)}; the MQTT "
            f"{'5' if level == 5 else '3.1.1'} client sent {sent} ([target.credentials], docs/scenarios.md "
            "\"Client credentials\")")
