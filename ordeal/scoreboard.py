"""The durability scoreboard: stored run reports summed into a broker x fault-class table.

Pure: it reads the run directories' report.json and scenario.json (and summary.json when there is one)
through contracts/versions.py, and builds the table; it starts nothing and checks nothing (no Spark, no
harness).  A run is any directory holding a report.json and a scenario.json, found by walking the given
paths; a directory holding a report.json beside an ``entry.json`` (an explore corpus entry) or a
``shrink.json`` (a shrink result) is a copy of a run stored elsewhere and is skipped (a shrink result's
``attempts/`` are runs of their own and are counted).  A run never checked (scenario.json and summary.json
but no report.json) has no verdict to count: it is listed apart (``unchecked``), not in the table.

Per run: its **broker** (scenario.json ``target``: ``reference``, with its broker node count when more than
one and the catalog defects switched on, or an external target's ``name``, with its node count when it
declares several ``nodes``), its **fault classes** (every kind of report.json ``faults`` whose ``bit`` is
true; a run with faults of several kinds counts once in each, a run with none applied is ``none``) and its
**outcome**: ``violation`` (an invariant failed), else ``unknown`` (an invariant or the run itself is
undecided: unknown is never a pass), else ``allowed`` (an ``allowed`` verdict: found, but the target never
promised to prevent it), else ``pass``.  Per (broker, fault class): the runs, the count of each outcome and
the finding in words: the failing invariants with their counts summed over the cell's runs, then the allowed
and the undecided ones, and one run to look at (the one with the most acknowledged messages lost, else the
first) with its replay command.

Outputs (``write_outputs``): scoreboard.json (``SCOREBOARD_VERSION``; docs/schemas/scoreboard.schema.json),
scoreboard.md (a Markdown table for docs/findings.md) and scoreboard.html (scoreboard.html.j2, autoescaped);
``text_table`` is what ``ordeal scoreboard`` prints.  All three are rendered from the JSON document.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from contracts.errors import UsageError
from contracts.exit_codes import EXIT_UNKNOWN
from contracts.versions import SchemaVersionError, read_json
from ordeal.tables import aligned

SCOREBOARD_VERSION = 1  # scoreboard.json (docs/schemas/scoreboard.schema.json)

PASS, VIOLATION, ALLOWED, UNKNOWN = "pass", "violation", "allowed", "unknown"
OUTCOMES = (PASS, VIOLATION, ALLOWED, UNKNOWN)
NO_FAULT = "none"
RUN_ITSELF = "run"  # an undecided entry about the run, not one invariant (summary.json exit 2)
# the invariants whose count is acknowledged messages never delivered (the pointer's "most lost")
LOSS_INVARIANTS = ("durability.lost", "durability.lost_allowed")
INVARIANT_VERDICTS = ("pass", "fail", "unknown", "not_applicable", "allowed")
REPORT_VERDICTS = ("pass", "fail", "unknown")
COPY_MARKERS = ("entry.json", "shrink.json")  # explore corpus entry, shrink result: copies of a run
REASON_CHARS = 100  # an undecided invariant's reason, as the words quote it

COLUMNS = ("broker", "fault class", "runs", "pass", "violation", "allowed", "unknown", "finding")


class ScoreboardError(UsageError):
    """Stored runs the scoreboard cannot read, or none at all."""


@dataclass(frozen=True)
class RunRecord:
    """One stored run as the scoreboard counts it."""

    run_dir: str
    scenario: str
    seed: int | None
    broker: str
    fault_classes: tuple[str, ...]
    outcome: str
    failing: tuple[tuple[str, int], ...]  # (invariant id, count) of every failed invariant
    allowed: tuple[tuple[str, int], ...]  # (invariant id, count) of every allowed one
    unknown: tuple[tuple[str, str], ...]  # (invariant id, or RUN_ITSELF, and the reason) of what is undecided
    lost: int  # acknowledged messages never delivered (durability.lost + durability.lost_allowed)
    replay: str


@dataclass(frozen=True)
class Total:
    """One invariant over a cell's runs: its counts summed, and in how many runs it appeared."""

    id: str
    count: int
    runs: int


@dataclass(frozen=True)
class Pointer:
    """The run a cell's finding points to."""

    run_dir: str
    outcome: str
    lost: int
    replay: str


@dataclass(frozen=True)
class Cell:
    """One (broker, fault class) of the table."""

    broker: str
    fault_class: str
    runs: int
    passed: int
    violation: int
    allowed: int
    unknown: int
    failing: tuple[Total, ...]
    allowed_invariants: tuple[Total, ...]
    unknown_invariants: tuple[Total, ...]
    unknown_reason: str  # the first undecided reason of the cell (empty when nothing was undecided)
    pointer: Pointer | None


# --- finding the runs ------------------------------------------------------------------------------------

def find_run_dirs(paths: Sequence[str | Path]) -> tuple[list[Path], list[Path], list[Path]]:
    """The run directories under ``paths`` (each a run directory or a tree of them), in path order; the
    copies skipped (explore corpus entries, shrink results); and the runs never checked (a scenario.json and
    a summary.json but no report.json: no verdict to count).  A run directory is not descended into."""
    runs: list[Path] = []
    copies: list[Path] = []
    unchecked: list[Path] = []
    seen: set[Path] = set()
    for root in paths:
        root = Path(root)
        if not root.is_dir():
            raise ScoreboardError(f"{root}: not a directory (give run directories or directories holding them)")
        for directory, subdirs, files in os.walk(root):
            here = Path(directory)
            subdirs.sort()
            if "report.json" not in files:
                if "scenario.json" in files and "summary.json" in files:
                    unchecked.append(here)
                    subdirs[:] = []
                continue
            if "scenario.json" not in files and any(marker in files for marker in COPY_MARKERS):
                copies.append(here)
                continue  # a shrink result's attempts/ are runs: keep walking
            subdirs[:] = []  # a run directory: its history/, logs/ and data/ hold no runs
            resolved = here.resolve()
            if resolved not in seen:
                seen.add(resolved)
                runs.append(here)
    return runs, copies, unchecked


# --- reading one run -------------------------------------------------------------------------------------

def _read(path: Path, kind: str) -> dict[str, Any]:
    try:
        return read_json(path, kind)
    except SchemaVersionError as error:
        raise ScoreboardError(str(error)) from error
    except FileNotFoundError as error:
        raise ScoreboardError(f"{path}: missing: a run directory holds report.json and scenario.json side by "
                              "side (the run's normalised scenario, written when it started)") from error
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ScoreboardError(f"{path}: cannot be read as {kind}: {error}") from error


def _expect(condition: bool, path: Path, where: str, expected: str, value: Any) -> None:
    if not condition:
        raise ScoreboardError(f"{path}: {where}: expected {expected}, got {value!r}")


def broker_name(scenario: Mapping[str, Any], path: Path) -> str:
    """The broker under test as the table names it (see the module's docstring)."""
    target = scenario.get("target")
    _expect(isinstance(target, dict), path, "target", "a table with 'kind'", target)
    kind = target.get("kind")
    details: list[str] = []
    if kind == "reference":
        topology = scenario.get("topology") or {}
        nodes = topology.get("broker_nodes", 1) if isinstance(topology, dict) else 1
        _expect(isinstance(nodes, int) and not isinstance(nodes, bool), path, "topology.broker_nodes",
                "an integer", nodes)
        name = "reference"
        if nodes > 1:
            details.append(f"{nodes} nodes")
        broker = scenario.get("broker") or {}
        defects = (broker.get("defects") or []) if isinstance(broker, dict) else []
        _expect(isinstance(defects, list) and all(isinstance(d, str) for d in defects), path, "broker.defects",
                "a list of defect names", defects)
        if defects:
            details.append(("defect " if len(defects) == 1 else "defects ") + ", ".join(defects))
    elif kind == "external":
        name = target.get("name")
        _expect(isinstance(name, str) and bool(name), path, "target.name", "the external target's name", name)
        nodes = target.get("nodes")
        if isinstance(nodes, list) and len(nodes) > 1:
            details.append(f"{len(nodes)} nodes")
    else:
        raise ScoreboardError(f"{path}: target.kind: expected 'reference' or 'external', got {kind!r}")
    return f"{name} ({'; '.join(details)})" if details else name


def applied_fault_classes(report: Mapping[str, Any], path: Path) -> tuple[str, ...]:
    """The kinds of the run's faults that were applied (``bit`` true), each once, in order of first
    appearance; ``("none",)`` when none was."""
    faults = report.get("faults", [])
    _expect(isinstance(faults, list), path, "faults", "a list", faults)
    kinds: list[str] = []
    for i, fault in enumerate(faults):
        _expect(isinstance(fault, dict) and isinstance(fault.get("kind"), str), path, f"faults[{i}]",
                "an object with a string 'kind'", fault)
        if fault.get("bit") is True and fault["kind"] not in kinds:
            kinds.append(fault["kind"])
    return tuple(kinds) or (NO_FAULT,)


def _invariants(report: Mapping[str, Any], path: Path) -> list[dict[str, Any]]:
    invariants = report.get("invariants")
    _expect(isinstance(invariants, list), path, "invariants", "a list of invariant verdicts", invariants)
    for i, item in enumerate(invariants):
        _expect(isinstance(item, dict) and isinstance(item.get("id"), str), path, f"invariants[{i}]",
                "an object with a string 'id'", item)
        _expect(item.get("verdict") in INVARIANT_VERDICTS, path, f"invariants[{i}].verdict ({item['id']})",
                f"one of {', '.join(INVARIANT_VERDICTS)}", item.get("verdict"))
    return invariants


def _count(item: Mapping[str, Any]) -> int:
    count = item.get("count")
    return count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 0


def _run_level_unknown(summary: Mapping[str, Any] | None) -> str:
    """Why the run itself is undecided (summary.json exit 2, e.g. a fault that could not be applied: a
    clean check does not turn it into a pass), or empty."""
    if not summary or summary.get("exit_code") != EXIT_UNKNOWN:
        return ""
    notes = summary.get("notes") if isinstance(summary.get("notes"), list) else []
    check = summary.get("check") if isinstance(summary.get("check"), str) else ""
    reason = summary.get("error") or next(iter(notes), "") or check
    return f"summary.json exit {EXIT_UNKNOWN}{': ' + str(reason) if reason else ''}"


def read_run(run_dir: str | Path) -> RunRecord:
    """One stored run: ScoreboardError naming the file for an unknown schema version or an unreadable
    report or scenario."""
    run_dir = Path(run_dir)
    report_path, scenario_path, summary_path = (run_dir / name for name in
                                                ("report.json", "scenario.json", "summary.json"))
    report = _read(report_path, "report.json")
    scenario = _read(scenario_path, "scenario.json")
    summary = _read(summary_path, "summary.json") if summary_path.is_file() else None
    _expect(report.get("verdict") in REPORT_VERDICTS, report_path, "verdict",
            f"one of {', '.join(REPORT_VERDICTS)}", report.get("verdict"))
    invariants = _invariants(report, report_path)
    failing = tuple((i["id"], _count(i)) for i in invariants if i["verdict"] == "fail")
    allowed = tuple((i["id"], _count(i)) for i in invariants if i["verdict"] == "allowed")
    unknown = [(i["id"], str(i.get("reason") or "")) for i in invariants if i["verdict"] == "unknown"]
    run_reason = _run_level_unknown(summary)
    if run_reason:
        unknown.append((RUN_ITSELF, run_reason))
    if report["verdict"] == "unknown" and not unknown:
        unknown.append((RUN_ITSELF, "report.json verdict unknown"))
    if failing or report["verdict"] == "fail":
        outcome = VIOLATION
    elif unknown:
        outcome = UNKNOWN
    elif allowed:
        outcome = ALLOWED
    else:
        outcome = PASS
    lost = sum(_count(i) for i in invariants if i["id"] in LOSS_INVARIANTS and i["verdict"] in ("fail", "allowed"))
    replay = report.get("replay")
    if not isinstance(replay, str) or not replay:
        replay = shlex.join(["ordeal", "replay", str(run_dir)])
    meta = scenario.get("scenario") if isinstance(scenario.get("scenario"), dict) else {}
    seed = (summary or {}).get("seed")
    if seed is None:  # a run checked without a summary.json: its manifest says
        history = report.get("history") if isinstance(report.get("history"), dict) else {}
        seed = (history.get("manifest") or {}).get("seed") if isinstance(history.get("manifest"), dict) else None
    return RunRecord(run_dir=str(run_dir), scenario=str(meta.get("name") or (summary or {}).get("scenario") or ""),
                     seed=seed if isinstance(seed, int) else None, broker=broker_name(scenario, scenario_path),
                     fault_classes=applied_fault_classes(report, report_path), outcome=outcome,
                     failing=failing, allowed=allowed, unknown=tuple(unknown), lost=lost, replay=replay)


# --- the table -------------------------------------------------------------------------------------------

def _totals(pairs: Iterable[tuple[str, int]]) -> tuple[Total, ...]:
    counts: dict[str, list[int]] = {}
    for invariant, count in pairs:
        entry = counts.setdefault(invariant, [0, 0])
        entry[0] += count
        entry[1] += 1
    return tuple(Total(i, c, r) for i, (c, r) in sorted(counts.items(), key=lambda kv: (-kv[1][0], kv[0])))


def _runs(n: int) -> str:
    return f"{n} run" if n == 1 else f"{n} runs"


def _pointer(runs: Sequence[RunRecord]) -> Pointer | None:
    """The run to look at: among the runs of the worst outcome present (violation, then allowed, then
    unknown), the one with the most acknowledged messages lost, else the first."""
    for outcome in (VIOLATION, ALLOWED, UNKNOWN):
        candidates = [r for r in runs if r.outcome == outcome]
        if candidates:
            best = max(candidates, key=lambda r: r.lost)  # max keeps the first of equals
            return Pointer(best.run_dir, best.outcome, best.lost, best.replay)
    return None


def _shorten(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= REASON_CHARS else text[:REASON_CHARS - 1] + "…"


def finding_words(cell: Mapping[str, Any], code: Callable[[str], str] = str) -> str:
    """The finding in words, from one cell of the document; ``code`` marks a path or a command (Markdown
    puts them in backticks)."""
    pointer = cell["pointer"]
    if pointer is None:
        return f"nothing found ({_runs(cell['runs'])} passed)"

    def listed(totals: Sequence[Mapping[str, Any]], with_counts: bool = True) -> str:
        return ", ".join(f"{t['id']} {t['count']} ({_runs(t['runs'])})" if with_counts
                         else f"{'the run itself' if t['id'] == RUN_ITSELF else t['id']} ({_runs(t['runs'])})"
                         for t in totals)

    parts = []
    if cell["failing"]:
        parts.append(f"violated: {listed(cell['failing'])}")
    if cell["allowed_invariants"]:
        parts.append(f"allowed: {listed(cell['allowed_invariants'])}")
    if cell["unknown_invariants"]:
        reason = cell["unknown_reason"]
        parts.append(f"undecided: {listed(cell['unknown_invariants'], with_counts=False)}"
                     + (f", first reason: {_shorten(reason)}" if reason else ""))
    where = (f"most acknowledged messages lost: {pointer['lost']} in {code(pointer['run_dir'])}" if pointer["lost"]
             else f"see {code(pointer['run_dir'])}")
    return "; ".join(parts) + f"; {where}; replay: {code(pointer['replay'])}"


def build_cells(runs: Sequence[RunRecord]) -> tuple[Cell, ...]:
    """The table, one cell per (broker, fault class) seen; brokers in name order, fault classes with
    ``none`` first, then in name order."""
    keys = sorted({(r.broker, c) for r in runs for c in r.fault_classes},
                  key=lambda k: (k[0], k[1] != NO_FAULT, k[1]))
    cells = []
    for broker, fault_class in keys:
        mine = [r for r in runs if r.broker == broker and fault_class in r.fault_classes]
        failing = _totals(p for r in mine for p in r.failing)
        allowed = _totals(p for r in mine for p in r.allowed)
        unknown = _totals((invariant, 0) for r in mine for invariant, _ in r.unknown)
        reason = next((why for r in mine for _, why in r.unknown if why), "")
        pointer = _pointer(mine)
        by_outcome = {o: sum(1 for r in mine if r.outcome == o) for o in OUTCOMES}
        cells.append(Cell(broker=broker, fault_class=fault_class, runs=len(mine), passed=by_outcome[PASS],
                          violation=by_outcome[VIOLATION], allowed=by_outcome[ALLOWED],
                          unknown=by_outcome[UNKNOWN], failing=failing, allowed_invariants=allowed,
                          unknown_invariants=unknown, unknown_reason=reason, pointer=pointer))
    return tuple(cells)


def build(paths: Sequence[str | Path]) -> dict[str, Any]:
    """scoreboard.json's document for the runs under ``paths``; ScoreboardError when none is found or one
    cannot be read."""
    run_dirs, copies, unchecked = find_run_dirs(paths)
    if not run_dirs:
        where = ", ".join(str(p) for p in paths)
        raise ScoreboardError(f"no run directory (a directory holding report.json and scenario.json) under "
                              f"{where}" + (f"; {len(copies)} copies of runs skipped (explore corpus entries, "
                                            "shrink results)" if copies else "")
                              + (f"; {len(unchecked)} runs never checked (no report.json; `ordeal check "
                                 "RUN_DIR` checks one)" if unchecked else ""))
    runs = [read_run(d) for d in run_dirs]
    return document(paths, runs, build_cells(runs), copies, unchecked)


def document(paths: Sequence[str | Path], runs: Sequence[RunRecord], cells: Sequence[Cell],
             copies: Sequence[Path] = (), unchecked: Sequence[Path] = ()) -> dict[str, Any]:
    def totals(items: Sequence[Total]) -> list[dict[str, Any]]:
        return [{"id": t.id, "count": t.count, "runs": t.runs} for t in items]

    cell_documents = [{"broker": c.broker, "fault_class": c.fault_class, "runs": c.runs, "pass": c.passed,
                       "violation": c.violation, "allowed": c.allowed, "unknown": c.unknown,
                       "failing": totals(c.failing), "allowed_invariants": totals(c.allowed_invariants),
                       "unknown_invariants": totals(c.unknown_invariants), "unknown_reason": c.unknown_reason,
                       "pointer": None if c.pointer is None else {"run_dir": c.pointer.run_dir,
                                                                  "outcome": c.pointer.outcome,
                                                                  "lost": c.pointer.lost,
                                                                  "replay": c.pointer.replay}}
                      for c in cells]
    return {
        "schema_version": SCOREBOARD_VERSION,
        "paths": [str(p) for p in paths],
        "brokers": sorted({r.broker for r in runs}),
        "fault_classes": sorted({c for r in runs for c in r.fault_classes}, key=lambda c: (c != NO_FAULT, c)),
        "outcomes": {o: sum(1 for r in runs if r.outcome == o) for o in OUTCOMES},
        "skipped_copies": [str(c) for c in copies],
        "unchecked": [str(u) for u in unchecked],
        "cells": [c | {"finding": finding_words(c)} for c in cell_documents],
        "runs": [{"run_dir": r.run_dir, "scenario": r.scenario, "seed": r.seed, "broker": r.broker,
                  "fault_classes": list(r.fault_classes), "outcome": r.outcome,
                  "failing": dict(r.failing), "allowed": dict(r.allowed),
                  "unknown": [{"invariant": i, "reason": why} for i, why in r.unknown],
                  "lost": r.lost, "replay": r.replay} for r in runs],
    }


# --- outputs ---------------------------------------------------------------------------------------------

def table_rows(doc: Mapping[str, Any]) -> list[tuple[str, ...]]:
    return [(c["broker"], c["fault_class"], str(c["runs"]), str(c["pass"]), str(c["violation"]),
             str(c["allowed"]), str(c["unknown"]), c["finding"]) for c in doc["cells"]]


def _closing(doc: Mapping[str, Any]) -> str:
    outcomes = doc["outcomes"]
    line = (f"{sum(outcomes.values())} runs: {outcomes[PASS]} pass, {outcomes[VIOLATION]} violation, "
            f"{outcomes[ALLOWED]} allowed, {outcomes[UNKNOWN]} unknown; a run with faults of several kinds "
            "counts in each of their rows")
    if doc["skipped_copies"]:
        line += f"; {len(doc['skipped_copies'])} copies of runs skipped (explore corpus entries, shrink results)"
    if doc["unchecked"]:
        count = len(doc["unchecked"])
        line += (f"; {count} run{'s' if count != 1 else ''} never checked, not counted (no report.json: "
                 f"{', '.join(doc['unchecked'])})")
    return line


def text_table(doc: Mapping[str, Any]) -> str:
    return "\n".join([*aligned(COLUMNS, table_rows(doc)), "", _closing(doc)])


def markdown(doc: Mapping[str, Any]) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for c in doc["cells"]:
        finding = finding_words(c, code=lambda text: f"`{text}`")
        lines.append("| " + " | ".join([cell(c["broker"]), cell(c["fault_class"]), str(c["runs"]), str(c["pass"]),
                                         str(c["violation"]), str(c["allowed"]), str(c["unknown"]), cell(finding)])
                     + " |")
    return "\n".join([*lines, "", _closing(doc) + "."]) + "\n"


OUTCOME_COLOURS = {VIOLATION: "#f7d4d4", UNKNOWN: "#f7ecc4", ALLOWED: "#dde6f7", PASS: "#d4f7d4"}

_ENVIRONMENT = jinja2.Environment(
    loader=jinja2.FileSystemLoader(Path(__file__).resolve().parent),
    autoescape=True,  # findings quote stored reports' text (reasons, paths)
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
)


def render_html(doc: Mapping[str, Any]) -> str:
    rows = []
    for c, cells in zip(doc["cells"], table_rows(doc), strict=True):
        worst = next((o for o in (VIOLATION, UNKNOWN, ALLOWED) if c[o]), PASS)
        pointer = c["pointer"]
        rows.append({"colour": OUTCOME_COLOURS[worst], "cells": cells[:-1], "finding": c["finding"],
                     "report": str(Path(pointer["run_dir"]).resolve() / "report.html") if pointer else None})
    return _ENVIRONMENT.get_template("scoreboard.html.j2").render(
        document=doc, head=(*COLUMNS, "report"), rows=rows, closing=_closing(doc))


def write_outputs(doc: Mapping[str, Any], out: str | Path) -> list[Path]:
    """scoreboard.json, scoreboard.md and scoreboard.html in ``out`` (made if missing)."""
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ScoreboardError(f"--out {out}: cannot be made a directory: {error}") from error
    written = [out / "scoreboard.json", out / "scoreboard.md", out / "scoreboard.html"]
    written[0].write_text(json.dumps(doc, indent=2) + "\n")
    written[1].write_text(markdown(doc))
    written[2].write_text(render_html(doc))
    return written
