"""One MQTT CONNECT, by hand: is the broker ready, and does it speak this protocol level?

A few bytes on a plain socket (no client library state, no threads), so a readiness check can run every
50 ms while a broker boots, and a refusal says what the broker answered: a CONNACK with a return / reason
code (in words: harness/connack.py), a closed connection, or silence.  With credentials the CONNECT carries
the user name and password (MQTT 3.1.1 and 5 §3.1.2.8-9 flags, §3.1.3.4-5 payload fields).  With TLS
([target.tls], harness/tls.py) the CONNECT goes over a TLS connection verified against the run's CA; a
certificate that does not verify, or a handshake the broker refuses, is a lasting answer (``tls_failed``).
A plain CONNECT the broker closes without a CONNACK is followed by a TLS handshake: a port that completes
one is a TLS listener the clients do not speak TLS to (``tls_failed`` too, saying so).
"""

from __future__ import annotations

import socket
import ssl
import struct
from contextlib import closing
from dataclasses import dataclass

from harness.connack import is_auth_refusal, words
from harness.tls import GUIDE, ClientTls, failure_words, is_lasting
from reference_broker.codec import encode_varint  # MQTT's variable byte integer, one definition

LEVEL_NAMES = {4: "3.1.1", 5: "5"}


@dataclass(frozen=True)
class ConnectResult:
    ok: bool
    detail: str  # what the broker answered, in words
    code: int | None = None  # the CONNACK's return (3.1.1) / reason (5) code, if one came
    # the CONNACK says the credentials are wrong or missing (3.1.1: 4, 5; MQTT 5: 0x86, 0x87, 0x8C)
    refused_credentials: bool = False
    # a TLS failure that waiting will not change: the certificate did not verify, the broker refused the
    # handshake, or the port is a TLS listener and the CONNECT was plain (detail says which)
    tls_failed: bool = False


USER_NAME_FLAG, PASSWORD_FLAG, CLEAN_START_FLAG = 0x80, 0x40, 0x02  # CONNECT flags (§3.1.2.3)


def connect_packet(level: int, client_id: str, username: str | None = None, password: str | None = None) -> bytes:
    """A clean-start CONNECT at protocol level 4 (3.1.1) or 5, keep-alive 60 s, no will; with a user name
    (UTF-8 string) and password (binary data) after the client id when given (a password needs a user name:
    [MQTT-3.1.2-22] in 3.1.1)."""
    if password is not None and username is None:
        raise ValueError("a password needs a user name (MQTT 3.1.1 [MQTT-3.1.2-22])")
    flags = CLEAN_START_FLAG | (USER_NAME_FLAG if username is not None else 0) | (
        PASSWORD_FLAG if password is not None else 0)
    variable = b"\x00\x04MQTT" + bytes([level, flags]) + struct.pack("!H", 60)
    if level == 5:
        variable += b"\x00"  # no properties
    payload = _field(client_id.encode())
    if username is not None:
        payload += _field(username.encode())
    if password is not None:
        payload += _field(password.encode())
    body = variable + payload
    return b"\x10" + encode_varint(len(body)) + body


def _field(data: bytes) -> bytes:
    """A UTF-8 string or binary data field: two length bytes, then the bytes (§1.5.3 / §1.5.6)."""
    return struct.pack("!H", len(data)) + data


def mqtt_connect(host: str, port: int, level: int = 4, timeout_s: float = 2.0,
                 client_id: str = "ordeal-probe", username: str | None = None,
                 password: str | None = None, tls: ClientTls | None = None) -> ConnectResult:
    """Send CONNECT, read CONNACK, send DISCONNECT (over TLS when ``tls`` is given).  ok = a CONNACK with
    code 0."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as raw:
            raw.settimeout(timeout_s)
            sock = tls.context().wrap_socket(raw, server_hostname=tls.server_hostname(host)) if tls else raw
            with closing(sock):
                result = _exchange(sock, level, client_id, username, password)
    except ConnectionRefusedError:
        return ConnectResult(False, "the port refuses connections")
    except TimeoutError:
        return ConnectResult(False, f"no answer within {timeout_s} s")
    except ssl.SSLError as error:
        return ConnectResult(False, failure_words(error, tls), tls_failed=is_lasting(error))
    except (ConnectionResetError, BrokenPipeError) as error:
        result = ConnectResult(False, f"{CLOSED} ({type(error).__name__}: {error})")
    except OSError as error:
        return ConnectResult(False, f"{type(error).__name__}: {error}")
    if tls is None and result.detail.startswith(CLOSED) and speaks_tls(host, port, timeout_s):
        return ConnectResult(False, f"{result.detail}, and the port completes a TLS handshake: it is a TLS "
                                    "listener and the clients speak plain MQTT to it (set [target.tls] enabled = "
                                    f"true; {GUIDE})", tls_failed=True)
    return result


CLOSED = "the broker closed the connection without a CONNACK"


def _exchange(sock: socket.socket, level: int, client_id: str, username: str | None,
              password: str | None) -> ConnectResult:
    sock.sendall(connect_packet(level, client_id, username, password))
    head = _read(sock, 2)
    if not head:
        return ConnectResult(False, f"{CLOSED} to an MQTT {LEVEL_NAMES.get(level, level)} CONNECT")
    if head[0] != 0x20:
        return ConnectResult(False, f"expected a CONNACK (0x20), got packet type 0x{head[0]:02x}")
    body = _read(sock, head[1] & 0x7F)
    if len(body) < 2:
        return ConnectResult(False, "a truncated CONNACK")
    code = body[1]
    if code != 0:
        return ConnectResult(False, words(level, code),
                             code=code, refused_credentials=is_auth_refusal(level, code))
    try:
        sock.sendall(b"\xe0\x00")
    except OSError:
        pass
    return ConnectResult(True, "CONNACK 0", code=0)


def speaks_tls(host: str, port: int, timeout_s: float = 2.0) -> bool:
    """Does the port complete a TLS handshake (nothing verified), or answer a ClientHello with a TLS alert?"""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as raw:
            raw.settimeout(timeout_s)
            with context.wrap_socket(raw):
                return True
    except ssl.SSLError as error:  # an alert from the peer is TLS too (e.g. it wants a client certificate)
        return "ALERT" in (error.reason or "")
    except OSError:
        return False


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
