"""One MQTT CONNECT, by hand: is the broker ready, and does it speak this protocol level?

A few bytes on a plain socket (no client library state, no threads), so a readiness check can run every
50 ms while a broker boots, and a refusal says what the broker answered: a CONNACK with a return / reason
code, a closed connection, or silence.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

from reference_broker.codec import encode_varint  # MQTT's variable byte integer, one definition

LEVEL_NAMES = {4: "3.1.1", 5: "5"}


@dataclass(frozen=True)
class ConnectResult:
    ok: bool
    detail: str  # what the broker answered, in words


def connect_packet(level: int, client_id: str) -> bytes:
    """A clean-start CONNECT at protocol level 4 (3.1.1) or 5, keep-alive 60 s, no will, no credentials."""
    cid = client_id.encode()
    variable = b"\x00\x04MQTT" + bytes([level, 0x02]) + struct.pack("!H", 60)
    if level == 5:
        variable += b"\x00"  # no properties
    payload = struct.pack("!H", len(cid)) + cid
    body = variable + payload
    return b"\x10" + encode_varint(len(body)) + body


def mqtt_connect(host: str, port: int, level: int = 4, timeout_s: float = 2.0,
                 client_id: str = "ordeal-probe") -> ConnectResult:
    """Send CONNECT, read CONNACK, send DISCONNECT.  ok = a CONNACK with code 0."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.settimeout(timeout_s)
            sock.sendall(connect_packet(level, client_id))
            head = _read(sock, 2)
            if not head:
                return ConnectResult(False, f"the broker closed the connection without a CONNACK to an MQTT "
                                            f"{LEVEL_NAMES.get(level, level)} CONNECT")
            if head[0] != 0x20:
                return ConnectResult(False, f"expected a CONNACK (0x20), got packet type 0x{head[0]:02x}")
            body = _read(sock, head[1] & 0x7F)
            if len(body) < 2:
                return ConnectResult(False, "a truncated CONNACK")
            code = body[1]
            if code != 0:
                return ConnectResult(False, f"CONNACK with {'reason' if level == 5 else 'return'} code 0x{code:02x}")
            try:
                sock.sendall(b"\xe0\x00")
            except OSError:
                pass
            return ConnectResult(True, "CONNACK 0")
    except ConnectionRefusedError:
        return ConnectResult(False, "the port refuses connections")
    except TimeoutError:
        return ConnectResult(False, f"no answer within {timeout_s} s")
    except OSError as error:
        return ConnectResult(False, f"{type(error).__name__}: {error}")


def _read(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        try:
            chunk = sock.recv(n - len(data))
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk
    return data
