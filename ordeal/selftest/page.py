"""selftest.html: one self-contained page (the per-defect table, every run with its first witness, the
false-alarm figures), rendered from page.html.j2 with every value escaped."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jinja2

from ordeal.selftest.judging import CAUGHT, FINDING, MISSED, PASSED, UNKNOWN, VIOLATION
from ordeal.selftest.outputs import COLUMNS, SUMMARY_COLUMNS, summary_rows, table_rows

OUTCOME_COLOURS = {CAUGHT: "#d4f7d4", PASSED: "#d4f7d4", MISSED: "#f7d4d4", VIOLATION: "#f7d4d4",
                   UNKNOWN: "#f7ecc4", FINDING: "#dde6f7"}

_ENVIRONMENT = jinja2.Environment(
    loader=jinja2.FileSystemLoader(Path(__file__).resolve().parent),
    autoescape=True,  # witnesses and reasons carry broker-supplied text
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
)


def render_html(document: Mapping[str, Any]) -> str:
    runs = [{"colour": OUTCOME_COLOURS.get(r["outcome"], "#fff"), "cells": cells,
             "report": _href(r["run_dir"]) if r["run_dir"] else None, "detail": r["witness"] or r["reason"] or ""}
            for r, cells in zip(document["rows"], table_rows(document), strict=True)]
    defects = [{"colour": OUTCOME_COLOURS.get(d["outcome"], "#fff"), "cells": cells}
               for d, cells in zip(document.get("defects", []), summary_rows(document), strict=True)]
    return _ENVIRONMENT.get_template("page.html.j2").render(
        document=document, uncovered=", ".join(document["uncovered"]) or "none",
        summary_head=SUMMARY_COLUMNS, defects=defects, head=(*COLUMNS, "run", "first witness / reason"), runs=runs)


def _href(run_dir: str) -> str:
    return str(Path(run_dir).resolve() / "report.html")
