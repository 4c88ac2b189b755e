"""Replay: play a stored plan again against a fresh topology and compare the verdicts.

A *stored run* is any directory holding ``scenario.toml`` and ``plan.json`` — a run directory, a shrink
result or an explore corpus entry — and, when it was checked, ``report.json``.  The new run gets its own
run directory (harness/run.py ``run_scenario(..., plan=...)``: same plan, so the same clients, messages,
subscriber actions and fault slots at the same offsets) and is checked like any run.
"""

from __future__ import annotations

import contextlib
import io
import json
import shlex
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contracts.errors import UsageError
from contracts.versions import read_json
from properties.plan import Plan, PlanError

FAIL, PASS, UNKNOWN = "fail", "pass", "unknown"


class StoredRunError(UsageError):
    """A directory that cannot be replayed; the message says which file is missing or broken."""


@dataclass(frozen=True)
class StoredRun:
    directory: Path
    scenario_path: Path
    plan: Plan
    report: dict[str, Any] | None  # None: never checked (or its report.json is unreadable)


@dataclass(frozen=True)
class Played:
    """One run of a plan: its directory, exit code and report (None when it was not checked)."""

    run_dir: Path
    exit_code: int
    report: dict[str, Any] | None
    seconds: float
    summary: dict[str, Any]

    @property
    def failing(self) -> frozenset[str]:
        return failing_invariants(self.report)


@dataclass(frozen=True)
class Comparison:
    original: dict[str, str]  # invariant -> verdict ({} when the original was never checked)
    replay: dict[str, str]
    only_original: frozenset[str]  # failing in the original only
    only_replay: frozenset[str]

    @property
    def agree(self) -> bool:
        """Same failing invariants and the same overall verdict (an unknown never agrees with a pass)."""
        return (bool(self.original) and not self.only_original and not self.only_replay
                and overall(self.original) == overall(self.replay))


def load_stored_run(directory: str | Path) -> StoredRun:
    directory = Path(directory)
    if not directory.is_dir():
        raise StoredRunError(f"{directory}: not a directory; expected a run directory (or a shrink result / "
                             "corpus entry) holding scenario.toml and plan.json")
    scenario_path = directory / "scenario.toml"
    plan_path = directory / "plan.json"
    for needed in (scenario_path, plan_path):
        if not needed.is_file():
            raise StoredRunError(f"{needed}: missing; a replayable directory holds scenario.toml and plan.json "
                                 "(every run directory does)")
    try:
        plan = Plan.from_json(plan_path.read_text(), source=str(plan_path))
    except PlanError as error:
        raise StoredRunError(str(error)) from error
    return StoredRun(directory, scenario_path, plan, read_report(directory))


def read_report(run_dir: Path) -> dict[str, Any] | None:
    path = Path(run_dir) / "report.json"
    try:
        report = read_json(path)  # an unknown schema_version raises SchemaVersionError, naming the file
    except (OSError, json.JSONDecodeError):
        return None
    return report if isinstance(report, dict) and "invariants" in report else None


def verdicts(report: dict[str, Any] | None) -> dict[str, str]:
    if not report:
        return {}
    return {item["id"]: item["verdict"] for item in report.get("invariants", [])}


def failing_invariants(report: dict[str, Any] | None) -> frozenset[str]:
    return frozenset(i for i, v in verdicts(report).items() if v == FAIL)


def overall(verdict_map: dict[str, str]) -> str:
    values = set(verdict_map.values())
    return FAIL if FAIL in values else UNKNOWN if (UNKNOWN in values or not values) else PASS


def first_witness(report: dict[str, Any] | None) -> dict[str, Any] | None:
    """The first witness of the first failing invariant (report order), with the invariant's id."""
    for item in (report or {}).get("invariants", []):
        if item.get("verdict") == FAIL:
            witness = (item.get("witnesses") or [None])[0]
            return {"invariant": item["id"], "count": item.get("count"), "witness": witness}
    return None


def compare(original: dict[str, Any] | None, replay: dict[str, Any] | None) -> Comparison:
    a, b = verdicts(original), verdicts(replay)
    fa, fb = failing_invariants(original), failing_invariants(replay)
    return Comparison(a, b, fa - fb, fb - fa)


def replay_command(directory: Path | str, out: Path | str | None = None) -> str:
    words = ["ordeal", "replay", str(directory)]
    if out is not None:
        words += ["--out", str(out)]
    return shlex.join(words)


def play(scenario_path: Path, plan: Plan, out: Path, *, quiet: bool = True, reporter=None,
         stop: threading.Event | None = None, spark_master: str | None = None, check: bool = True,
         keeper: Any = None) -> Played:
    """Run the plan (harness/run.py) and check it (unless check=False: no report, verdict unknown).  quiet:
    the checker's verdict table is kept in <run>/check-table.txt instead of being printed (shrink and
    explore run many plans).  keeper: a harness.local.keeper.TopologyKeeper (explore: one topology for its seeds)."""
    import time

    from ordeal import pipeline

    began = time.monotonic()
    captured = io.StringIO()
    with contextlib.redirect_stdout(captured) if quiet else contextlib.nullcontext():
        result = pipeline.run(scenario_path, plan.seed, out, reporter=reporter, check=check,
                              spark_master=spark_master, stop=stop, plan=plan,
                              replay_command="ordeal replay {run_dir}", keeper=keeper)  # its plan.json is what reproduces it
    if quiet and captured.getvalue():
        (result.run_dir / "check-table.txt").write_text(captured.getvalue())
    return Played(result.run_dir, result.exit_code, read_report(result.run_dir),
                  round(time.monotonic() - began, 3), result.summary)


def replay(stored: StoredRun, out: Path, *, reporter=None, quiet: bool = False,
           spark_master: str | None = None, check: bool = True) -> tuple[Played, Comparison]:
    played = play(stored.scenario_path, stored.plan, out, quiet=quiet, reporter=reporter,
                  spark_master=spark_master, check=check)
    note = {"replay_of": str(stored.directory), "replay": replay_command(played.run_dir),
            "original_failing": sorted(failing_invariants(stored.report)),
            "replay_failing": sorted(played.failing)}
    (played.run_dir / "replayed-from.json").write_text(json.dumps(note, indent=2) + "\n")
    return played, compare(stored.report, played.report)


def comparison_lines(comparison: Comparison) -> list[str]:
    """Side by side: every invariant that is not a pass in both runs, then the agreement line."""
    ids = list(comparison.replay) or list(comparison.original)
    ids += [i for i in comparison.original if i not in ids]
    width = max((len(i) for i in ids), default=10)
    lines = [f"{'invariant':<{width}}  {'original':<10} {'replay':<10}"]
    same_pass = 0
    for invariant in ids:
        a = comparison.original.get(invariant, "-" if not comparison.original else "missing")
        b = comparison.replay.get(invariant, "-" if not comparison.replay else "missing")
        if a == b == PASS:
            same_pass += 1
            continue
        mark = "" if a == b else "   <- differs"
        lines.append(f"{invariant:<{width}}  {a:<10} {b:<10}{mark}")
    lines.append(f"({same_pass} other invariants pass in both)")
    lines.append(f"overall: original {overall(comparison.original) if comparison.original else 'not checked'}"
                 f", replay {overall(comparison.replay) if comparison.replay else 'not checked'}")
    if not comparison.original:
        lines.append("agreement: unknown (the original run was never checked: no report.json)")
    elif comparison.agree:
        failing = sorted(failing_invariants_of(comparison.replay))
        lines.append(f"agreement: AGREE ({'same failing invariants: ' + ', '.join(failing) if failing else 'no failures'})")
    else:
        lines.append("agreement: DISAGREE"
                     + (f"; failing only in the original: {', '.join(sorted(comparison.only_original))}"
                        if comparison.only_original else "")
                     + (f"; failing only in the replay: {', '.join(sorted(comparison.only_replay))}"
                        if comparison.only_replay else "")
                     + ("" if comparison.only_original or comparison.only_replay else
                        f"; overall {overall(comparison.original)} vs {overall(comparison.replay)}"))
    return lines


def failing_invariants_of(verdict_map: dict[str, str]) -> frozenset[str]:
    return frozenset(i for i, v in verdict_map.items() if v == FAIL)
