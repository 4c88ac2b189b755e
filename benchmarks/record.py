"""Appending a benchmark's figures to the measurements log (docs/measurements.md).

Every benchmark takes ``--record``; with it, the figures it printed are also appended to the log as a dated
section: the benchmark's name, the UTC date and time, the git revision of the tree it ran on (``+dirty`` when
tracked files had local changes), the exact command line and a Markdown table of the figures. The log is
append-only: a section is never rewritten, so each figure keeps the command, date and tree that produced it.
"""

from __future__ import annotations

import datetime as dt
import json
import shlex
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOG = ROOT / "docs" / "measurements.md"
RECORDED_HEADING = "## Recorded by the benchmarks (`--record`)"


def revision(root: Path = ROOT) -> str:
    """The tree's short git revision, with ``+dirty`` when tracked files differ from it; ``unknown`` outside git."""
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=30, check=True).stdout.strip()
        changed = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                 capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}+dirty" if changed else head


def command_line(script: str | Path, argv: Sequence[str] | None = None) -> str:
    """The command as a user would type it from the repository root: ``python benchmarks/X.py ARGS``."""
    path = Path(script).resolve()
    try:
        shown = path.relative_to(ROOT)
    except ValueError:
        shown = path
    args = list(sys.argv[1:] if argv is None else argv)
    return shlex.join(["python", str(shown), *args])


def flatten(value: object, prefix: str = "") -> dict[str, object]:
    """A nested result as one level of dotted keys (``quiet.e2e_ms_p99``); lists stay whole."""
    if isinstance(value, Mapping):
        flat: dict[str, object] = {}
        for key, item in value.items():
            flat.update(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return flat
    return {prefix: value}


def figures(result: Mapping[str, object], drop: Iterable[str] = ()) -> list[dict[str, object]]:
    """One result (a benchmark's printed JSON) as rows of a two-column table, leaving out the ``drop`` keys
    (and anything under them)."""
    dropped = tuple(drop)
    return [{"figure": key, "value": value} for key, value in flatten(result).items()
            if not any(key == name or key.startswith(f"{name}.") for name in dropped)]


def transpose(rows: Sequence[Mapping[str, object]], by: str) -> list[dict[str, object]]:
    """Rows of many figures (one per history size, say) as one row per figure and one column per value of
    ``by``: a wide result stays a readable table."""
    flat = [flatten(row) for row in rows]
    names: list[str] = []
    for row in flat:
        names.extend(key for key in row if key != by and key not in names)
    return [{"figure": name, **{f"{by} {row.get(by)}": row.get(name) for row in flat}} for name in names]


def _cell(value: object) -> str:
    if value is None:
        text = "-"
    elif isinstance(value, str):
        text = value
    elif isinstance(value, float):
        text = f"{value:g}"
    elif isinstance(value, (list, tuple, dict)):
        text = json.dumps(value, separators=(", ", ": "))
    else:
        text = str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def table(rows: Sequence[Mapping[str, object]]) -> str:
    """The rows as a Markdown table; the columns are every key, in the order first seen."""
    columns: list[str] = []
    for row in rows:
        columns.extend(key for key in row if key not in columns)
    lines = ["| " + " | ".join(_cell(c) for c in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def section(benchmark: str, command: str, rows: Sequence[Mapping[str, object]], *, when: dt.datetime,
            tree: str) -> str:
    """One log entry: heading with benchmark, date and tree, the command line, the table."""
    stamp = when.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    body = table(rows) if rows else "(no figures)"
    return f"### {benchmark}, {stamp}, tree `{tree}`\n`{command}`\n\n{body}\n"


def append(benchmark: str, command: str, rows: Sequence[Mapping[str, object]], *, log: Path | None = None,
           when: dt.datetime | None = None, tree: str | None = None) -> Path:
    """Append one dated section to ``log`` (default ``LOG``, read at the call) under its recorded-runs heading,
    added at the end if missing."""
    log = LOG if log is None else log
    text = log.read_text(encoding="utf-8") if log.exists() else "# Measurements\n"
    entry = section(benchmark, command, rows, when=when or dt.datetime.now(dt.UTC),
                    tree=tree or revision())
    if RECORDED_HEADING not in text:
        text = text.rstrip("\n") + f"\n\n{RECORDED_HEADING}\n"
    log.write_text(text.rstrip("\n") + "\n\n" + entry, encoding="utf-8")
    return log
