"""The phrases every explanation shares: a time in seconds since the start of the run, a message's name."""

from __future__ import annotations

from typing import Any


def seconds(t: int | None, origin: int) -> str:
    return "?" if t is None else f"{(t - origin) / 1e6:.3f} s"


def message(w: dict[str, Any]) -> str:
    """The witness's message as "publisher#pub_seq"."""
    return f"{w.get('publisher')}#{w.get('pub_seq')}"
