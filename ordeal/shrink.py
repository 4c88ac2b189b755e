"""Shrink: minimise a failing run's plan by re-running smaller candidates against real topologies.

The candidates come from properties/shrink.py (pure, coarse before fine).  A candidate is *accepted* when
it fails the target invariants (by default: every invariant the original run failed) in K of N re-runs;
the search then restarts from the accepted plan at the granularity that worked.  It ends when no
candidate of the current plan is accepted (1-minimal for these reductions), after --max-attempts
candidates, or when the budget cannot pay for another candidate (never started past the budget).

Output directory (replayable like a run directory): shrunk-plan.json and plan.json (the minimal plan),
scenario.toml, report.json (the last accepted run's report, or the original's), shrink.json (settings,
every attempt, sizes, the replay command), attempts/ (every candidate's run directory).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from contracts.versions import read_json
from ordeal.replay import Played, StoredRun, play, replay_command
from properties.plan import Plan
from properties.shrink import PlanSize, candidates, plan_size

FIRST_RUN_GUESS_S = 60.0  # a run's wall time before any was measured: start, drain, stop, a cold Spark check


class ShrinkError(ValueError):
    """A shrink that cannot start; the message says why and what to do."""


@dataclass(frozen=True)
class RunsRule:
    """Accept a candidate when it fails the target in `needed` of `total` runs (--runs K/N)."""

    needed: int = 1
    total: int = 1

    @classmethod
    def parse(cls, text: str) -> RunsRule:
        try:
            needed_text, total_text = text.split("/")
            needed, total = int(needed_text), int(total_text)
        except ValueError as error:
            raise ShrinkError(f"--runs {text!r}: expected K/N with whole numbers, e.g. 1/1 or 2/3") from error
        if not 1 <= needed <= total <= 20:
            raise ShrinkError(f"--runs {text!r}: need 1 <= K <= N <= 20")
        return cls(needed, total)

    def __str__(self) -> str:
        return f"{self.needed}/{self.total}"


@dataclass(frozen=True)
class ShrinkSettings:
    runs: RunsRule = RunsRule()
    max_attempts: int = 40
    budget_s: float = 600.0
    target: frozenset[str] = frozenset()  # empty: the original's failing invariants
    spark_master: str | None = None


@dataclass(frozen=True)
class Attempt:
    number: int
    description: str
    dimension: str
    size: str
    accepted: bool
    matched: int  # runs that failed the target
    runs: int
    failing: tuple[tuple[str, ...], ...]  # per run, its failing invariants
    exit_codes: tuple[int, ...]
    run_dirs: tuple[str, ...]
    seconds: float


@dataclass
class ShrinkResult:
    out_dir: Path
    original: Plan
    minimal: Plan
    target: frozenset[str]
    attempts: list[Attempt] = field(default_factory=list)
    stop_reason: str = ""
    replay: str = ""
    best_report: dict[str, Any] = field(default_factory=dict)  # of the last accepted run, or the original

    @property
    def reduced(self) -> bool:
        return plan_size(self.minimal) < plan_size(self.original) or self.minimal != self.original


def matches(played: Played, target: frozenset[str]) -> bool:
    """A run reproduces the failure when it fails (exit 1) every target invariant; unknown never counts."""
    return played.exit_code == 1 and target <= played.failing


def _fingerprint(plan: Plan) -> str:
    return hashlib.sha256(plan.to_json().encode()).hexdigest()


# (plan, run directory parent, stop event) -> a checked run; the default plays it on a real topology
Player = Callable[[Plan, Path, threading.Event], Played]


def shrink(stored: StoredRun, settings: ShrinkSettings, out: Path,
           log: Callable[[str], None] = print, player: Player | None = None) -> ShrinkResult:
    if stored.report is None:
        raise ShrinkError(f"{stored.directory}: no report.json; shrink needs a checked failing run "
                          f"(run `ordeal check {stored.directory}` first)")
    original_failing = frozenset(i["id"] for i in stored.report["invariants"] if i["verdict"] == "fail")
    target = settings.target or original_failing
    if not original_failing:
        raise ShrinkError(f"{stored.directory}: the run did not fail (verdict {stored.report.get('verdict')}); "
                          "there is nothing to shrink")
    if not target <= original_failing:
        raise ShrinkError(f"--invariant {', '.join(sorted(target - original_failing))}: the original run did "
                          f"not fail it; it failed {', '.join(sorted(original_failing))}")

    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    out_dir = Path(out) / f"shrink-{stored.directory.name}-{stamp}"
    (out_dir / "attempts").mkdir(parents=True)
    shutil.copyfile(stored.scenario_path, out_dir / "scenario.toml")
    result = ShrinkResult(out_dir, stored.plan, stored.plan, target)
    stop = threading.Event()  # set by SIGINT/SIGTERM during a run (harness/run.py installs the handler)
    if player is None:
        def player(plan: Plan, parent: Path, stop: threading.Event) -> Played:
            return play(out_dir / "scenario.toml", plan, parent, stop=stop, spark_master=settings.spark_master)
    result.best_report = stored.report
    began = time.monotonic()
    log(f"shrinking {stored.directory} ({plan_size(stored.plan)}); target: fails "
        f"{', '.join(sorted(target))} in {settings.runs} runs; budget {settings.budget_s:g} s, "
        f"at most {settings.max_attempts} attempts")

    try:
        _search(result, settings, stored, player, stop, log)
    except KeyboardInterrupt:
        result.stop_reason = "interrupted (SIGINT/SIGTERM); the smallest plan so far is kept"
    result.replay = replay_command(out_dir)
    _write_outputs(result, settings, stored)
    log(f"stopped: {result.stop_reason}")
    log(f"original: {plan_size(result.original)}")
    log(f"minimal:  {plan_size(result.minimal)}  ({len(result.attempts)} attempts, "
        f"{time.monotonic() - began:.0f} s)")
    log(f"shrunk plan: {out_dir / 'shrunk-plan.json'}")
    log(f"replay: {result.replay}")
    return result


def _search(result: ShrinkResult, settings: ShrinkSettings, stored: StoredRun, player: Player,
            stop: threading.Event, log: Callable[[str], None]) -> None:
    began = time.monotonic()
    run_estimate = _measured_run_seconds(stored) or FIRST_RUN_GUESS_S
    measured: list[float] = []
    tried = {_fingerprint(stored.plan)}
    start_chunks: dict[str, int] = {}
    while not result.stop_reason:
        accepted = None
        for candidate in candidates(result.minimal, start_chunks):
            fingerprint = _fingerprint(candidate.plan)
            if fingerprint in tried:
                continue
            if len(result.attempts) >= settings.max_attempts:
                result.stop_reason = f"--max-attempts {settings.max_attempts} reached"
                break
            remaining = settings.budget_s - (time.monotonic() - began)
            # Why: a candidate needs up to N runs; never start one the budget cannot pay for.
            if remaining < run_estimate * settings.runs.total:
                result.stop_reason = (f"budget: {remaining:.0f} s left, a candidate needs about "
                                      f"{run_estimate * settings.runs.total:.0f} s")
                break
            tried.add(fingerprint)
            attempt, runs = _try(candidate, len(result.attempts) + 1, settings, result.target,
                                 result.out_dir / "attempts", player, stop)
            result.attempts.append(attempt)
            measured += [p.seconds for p in runs]
            run_estimate = max(measured)  # the slowest run so far: the estimate errs on the safe side
            log(f"attempt {attempt.number:>3}  {attempt.size:<70}  "
                f"{'FAILS' if attempt.accepted else 'passes'} {attempt.matched}/{attempt.runs}  "
                f"{attempt.seconds:>5.0f} s  {candidate.description}")
            if stop.is_set():
                result.stop_reason = "interrupted (SIGINT/SIGTERM); the smallest plan so far is kept"
                return
            if attempt.accepted:
                accepted = candidate
                result.best_report = next(p.report for p in runs if matches(p, result.target))
                break
        if accepted is None:
            result.stop_reason = result.stop_reason or "minimal: no smaller candidate reproduces the failure"
            return
        result.minimal = accepted.plan
        start_chunks[accepted.dimension] = max(2, accepted.chunks)

def _try(candidate, number: int, settings: ShrinkSettings, target: frozenset[str], attempts_dir: Path,
         player: Player, stop: threading.Event) -> tuple[Attempt, list[Played]]:
    """Run the candidate up to N times; stop as soon as K matched or K can no longer be reached."""
    runs: list[Played] = []
    matched = 0
    began = time.monotonic()
    for index in range(settings.runs.total):
        played = player(candidate.plan, attempts_dir, stop)
        runs.append(played)
        matched += matches(played, target)
        left = settings.runs.total - index - 1
        if matched >= settings.runs.needed or matched + left < settings.runs.needed or stop.is_set():
            break
    attempt = Attempt(
        number=number, description=candidate.description, dimension=candidate.dimension,
        size=str(plan_size(candidate.plan)), accepted=matched >= settings.runs.needed, matched=matched,
        runs=len(runs), failing=tuple(tuple(sorted(p.failing)) for p in runs),
        exit_codes=tuple(p.exit_code for p in runs), run_dirs=tuple(str(p.run_dir) for p in runs),
        seconds=round(time.monotonic() - began, 1))
    return attempt, runs


def _measured_run_seconds(stored: StoredRun) -> float | None:
    """The original run's own wall time (run + check), when its summary and report say."""
    try:
        summary = read_json(stored.directory / "summary.json")
        total = float(summary["timings_s"]["total_s"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    check = float(((stored.report or {}).get("environment") or {}).get("check_seconds") or 0.0)
    return total + check


def _write_outputs(result: ShrinkResult, settings: ShrinkSettings, stored: StoredRun) -> None:
    out = result.out_dir
    text = result.minimal.to_json()
    (out / "shrunk-plan.json").write_text(text)
    (out / "plan.json").write_text(text)
    (out / "report.json").write_text(json.dumps(result.best_report, indent=2) + "\n")
    original_size: PlanSize = plan_size(result.original)
    minimal_size: PlanSize = plan_size(result.minimal)
    (out / "shrink.json").write_text(json.dumps({
        "source": str(stored.directory),
        "target": sorted(result.target),
        "runs_rule": str(settings.runs),
        "max_attempts": settings.max_attempts,
        "budget_s": settings.budget_s,
        "stop_reason": result.stop_reason,
        "original_size": asdict(original_size),
        "minimal_size": asdict(minimal_size),
        "replay": result.replay,
        "attempts": [asdict(a) for a in result.attempts],
    }, indent=2) + "\n")
