"""The payload identity codec, including malformed payloads."""

from __future__ import annotations

import pytest

from contracts.payload import HEADER_SIZE, Identity, PayloadError, body_hash, decode, encode, try_decode


def test_round_trip_at_the_seeds_size():
    identity = Identity(publisher_index=7, seq=123456, send_wall_us=1_790_000_000_000_000)
    payload = encode(identity, 62)
    assert len(payload) == 62 and payload[:2] == b"OR" and payload[2] == 1
    assert decode(payload) == identity


def test_extremes_and_sizes():
    identity = Identity(publisher_index=2**32 - 1, seq=2**64 - 1, send_wall_us=2**64 - 1)
    for size in (32, 33, 1000, 70_000):
        payload = encode(identity, size)
        assert len(payload) == size and decode(payload) == identity


def test_body_hash_is_blake2b_64_and_sensitive():
    payload = encode(Identity(1, 1, 5), 62)
    assert len(body_hash(payload)) == 16
    assert body_hash(payload) == body_hash(bytes(payload))
    changed = payload[:-1] + bytes([payload[-1] ^ 1])
    assert body_hash(changed) != body_hash(payload)
    assert decode(changed) == decode(payload)  # identity survives a flipped filler bit; the hash tells


@pytest.mark.parametrize("bad, reason", [
    (b"", "shorter than the 23-byte identity header"),
    (b"OR\x01" + b"\x00" * 10, "shorter than the 23-byte identity header"),
    (b"XX\x01" + b"\x00" * 40, "does not start with the magic"),
    (b"OR\x02" + b"\x00" * 40, "identity version 2 is unknown"),
    (b"OR\x01" + b"\x00" * 4 + b"\x00" * 8 + b"\x00" * 8 + b"pad", "sequence number 0 is invalid"),
])
def test_malformed_payloads_are_refused_with_the_reason(bad: bytes, reason: str):
    with pytest.raises(PayloadError, match=reason):
        decode(bad)
    assert try_decode(bad) is None


def test_encode_refuses_impossible_identities():
    with pytest.raises(PayloadError, match="below the minimum 32"):
        encode(Identity(0, 1, 0), 31)
    with pytest.raises(PayloadError, match="sequence 0"):
        encode(Identity(0, 0, 0), 62)
    with pytest.raises(PayloadError, match="does not fit in u32"):
        encode(Identity(2**32, 1, 0), 62)
    assert HEADER_SIZE == 23
