"""``timed``: with $ORDEAL_CHECKER_TIMING set, how long each step of a check took (the benchmark's profile)."""

from __future__ import annotations

import os
import time
from contextlib import contextmanager


@contextmanager
def timed(label: str):
    """With $ORDEAL_CHECKER_TIMING set, print how long a step took (the benchmark's profile)."""
    started = time.monotonic()
    try:
        yield
    finally:
        if os.environ.get("ORDEAL_CHECKER_TIMING"):
            print(f"  {label}: {time.monotonic() - started:.2f} s", flush=True)
