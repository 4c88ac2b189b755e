"""The payload identity codec (docs/architecture.md, "Payload identity").

Layout, big-endian: magic ``b"OR"`` (2) | version u8 (1) | publisher index u32 (4) | sequence u64 (8) |
send wall time µs u64 (8) | filler up to the payload size.  The header is 23 bytes; scenarios require
payload_size >= 32.  The filler is derived from the identity (not random) so the same message always has
the same bytes and ``body_hash`` = blake2b-64 hex of the whole payload is reproducible.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

MAGIC = b"OR"
VERSION = 1
_HEADER = struct.Struct(">2sBIQQ")
HEADER_SIZE = _HEADER.size  # 23
MIN_SIZE = 32
_FILLER = b"ordeal-payload-filler-0123456789abcdefghijklmnopqrstuvwxyz"


class PayloadError(ValueError):
    """Bytes that are not an Ordeal payload (foreign, truncated, or of an unknown version)."""


@dataclass(frozen=True)
class Identity:
    publisher_index: int
    seq: int
    send_wall_us: int


def body_hash(payload: bytes) -> str:
    return hashlib.blake2b(payload, digest_size=8).hexdigest()


def encode(identity: Identity, size: int) -> bytes:
    if size < MIN_SIZE:
        raise PayloadError(f"payload size {size} is below the minimum {MIN_SIZE} (the identity needs it)")
    if not (0 <= identity.publisher_index < 2**32):
        raise PayloadError(f"publisher index {identity.publisher_index} does not fit in u32")
    if not (1 <= identity.seq < 2**64):
        raise PayloadError(f"sequence {identity.seq} must be in 1..2**64-1")
    if not (0 <= identity.send_wall_us < 2**64):
        raise PayloadError(f"send time {identity.send_wall_us} does not fit in u64")
    header = _HEADER.pack(MAGIC, VERSION, identity.publisher_index, identity.seq, identity.send_wall_us)
    remaining = size - HEADER_SIZE
    filler = (_FILLER * (remaining // len(_FILLER) + 1))[:remaining]
    return header + filler


def decode(payload: bytes) -> Identity:
    """The identity in a payload; PayloadError (saying why) when the bytes are not ours."""
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise PayloadError(f"payload must be bytes, got {type(payload).__name__}")
    payload = bytes(payload)
    if len(payload) < HEADER_SIZE:
        raise PayloadError(f"payload of {len(payload)} bytes is shorter than the {HEADER_SIZE}-byte identity header")
    magic, version, publisher_index, seq, send_wall_us = _HEADER.unpack_from(payload)
    if magic != MAGIC:
        raise PayloadError(f"payload does not start with the magic {MAGIC!r} (got {magic!r})")
    if version != VERSION:
        raise PayloadError(f"payload identity version {version} is unknown (this codec reads {VERSION})")
    if seq == 0:
        raise PayloadError("payload sequence number 0 is invalid (sequences start at 1)")
    return Identity(publisher_index=publisher_index, seq=seq, send_wall_us=send_wall_us)


def try_decode(payload: bytes) -> Identity | None:
    try:
        return decode(payload)
    except PayloadError:
        return None
