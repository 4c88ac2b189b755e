"""Plain-text tables for the terminal: the self-test's and the scoreboard's."""

from __future__ import annotations


def aligned(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    """The header, a rule of dashes, then the rows, each column padded to its widest cell."""
    rows = [header, *rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines
