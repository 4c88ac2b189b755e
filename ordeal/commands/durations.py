"""The wall-time budget option of ``ordeal shrink`` and ``ordeal explore``: '90', '90s', '10m', '1h30m'."""

from __future__ import annotations

import re

import click


def parse_duration(text: str, option: str = "--budget") -> float:
    """'90', '90s', '10m', '1h30m' -> seconds."""
    match = re.fullmatch(r"\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s?)?\s*", text)
    if not text.strip() or not match or not any(match.groups()):
        raise click.BadParameter(f"{text!r}: expected a duration like 90s, 10m, 1h30m or plain seconds",
                                 param_hint=option)
    hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
    total = hours * 3600 + minutes * 60 + seconds
    if total <= 0:
        raise click.BadParameter(f"{text!r}: must be more than zero", param_hint=option)
    return total
