"""Shrink: minimise a failing run's plan by re-running smaller candidates against real topologies.

The candidates come from properties/reduction.py (pure, coarse before fine).  A candidate is *accepted* when
it fails the target invariants (by default: every invariant the original run failed) in K of N re-runs;
the search then restarts from the accepted plan at the granularity that worked.  It ends when no
candidate of the current plan is accepted (1-minimal for these reductions), after --max-attempts
candidates, or when the budget cannot pay for another candidate (never started past the budget).

Rounds: the candidates are taken in order, up to ``--batch`` at a time (a round).  Each of a round's
candidates is run unchecked, then the whole round is checked in one Spark job
(``pipeline.check_and_record`` takes a list: one fixed cost instead of one per candidate); with K/N > 1 the
round's undecided candidates run again and are checked again together.  The first accepted candidate in
order wins, as if they had been tried one by one, so the minimal plan is the same; what a round costs is the
runs of the candidates after the winner (recorded as attempts too).  The runs share one topology, reset and
verified between them (harness/local/keeper.py), unless ``--fresh-topology``.

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

from contracts.errors import UsageError
from contracts.exit_codes import EXIT_FAIL
from contracts.versions import read_json
from ordeal.replay import Played, StoredRun, play, replay_command
from properties.plan import Plan
from properties.reduction import PlanSize, candidates, plan_size

FIRST_RUN_GUESS_S = 60.0  # a run's wall time before any was measured: start, drain, stop, a cold Spark check


class ShrinkError(UsageError):
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
    batch: int = 4  # candidates run before one check (a round); 1 = one check per candidate
    keep_topology: bool = True  # one topology for every candidate run, reset and verified between runs


@dataclass(frozen=True)
class Attempt:
    number: int
    description: str
    dimension: str
    size: str
    accepted: bool  # taken by the search: the first of its round to reproduce the failure (matched >= K)
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
    check_calls: list[int] = field(default_factory=list)  # runs checked per check call (one call per round)
    topology_fallbacks: list[str] = field(default_factory=list)  # why a kept topology was given up

    @property
    def reduced(self) -> bool:
        return plan_size(self.minimal) < plan_size(self.original) or self.minimal != self.original


def matches(played: Played, target: frozenset[str]) -> bool:
    """A run reproduces the failure when it fails (exit 1) every target invariant; unknown never counts."""
    return played.exit_code == EXIT_FAIL and target <= played.failing


def _fingerprint(plan: Plan) -> str:
    return hashlib.sha256(plan.to_json().encode()).hexdigest()


# (plan, run directory parent, stop event) -> a checked run (the tests' oracle; checks are not batched)
Player = Callable[[Plan, Path, threading.Event], Played]


class RoundPlayer:
    """Plays candidates and checks them a round at a time: ``run`` plays one plan without checking it,
    ``check`` checks a round's runs in one call.  The default plays real runs and checks them in one Spark
    job; given a ``player`` (a checked run per plan) it only plays."""

    def __init__(self, scenario_path: Path, settings: ShrinkSettings, player: Player | None = None,
                 keeper=None, check_runs=None) -> None:
        self.scenario_path, self.settings, self.player, self.keeper = scenario_path, settings, player, keeper
        self.check_calls: list[int] = []  # runs per check call
        self._check_runs = check_runs

    def run(self, plan: Plan, parent: Path, stop: threading.Event) -> Played:
        if self.player is not None:
            return self.player(plan, parent, stop)
        return play(self.scenario_path, plan, parent, stop=stop, spark_master=self.settings.spark_master,
                    check=False, keeper=self.keeper)

    def check(self, runs: list[Played]) -> list[Played]:
        """Every complete, unchecked run of the round in one call; the others are returned as they are."""
        if self.player is not None:
            return runs  # checked by the player already
        todo = [i for i, p in enumerate(runs) if p.summary.get("history_complete") and p.report is None]
        if not todo:
            return runs
        self.check_calls.append(len(todo))
        checked = list(runs)
        try:
            results = (self._check_runs or _check_and_record)([runs[i].run_dir for i in todo],
                                                              self.settings.spark_master)
            for i, item in zip(todo, results, strict=True):
                checked[i] = Played(runs[i].run_dir, item.exit_code, item.report, runs[i].seconds, item.summary)
        except Exception as error:  # noqa: BLE001 - a broken check makes the round's runs unknown, never accepted
            for i in todo:
                checked[i] = Played(runs[i].run_dir, 2, None, runs[i].seconds,
                                    {**runs[i].summary, "check": f"the checker failed: {type(error).__name__}: {error}"})
        return checked


def _check_and_record(run_dirs: list[Path], spark_master: str | None):
    from ordeal import pipeline

    return pipeline.check_and_record(run_dirs, spark_master=spark_master)


def shrink(stored: StoredRun, settings: ShrinkSettings, out: Path,
           log: Callable[[str], None] = print, player: Player | None = None,
           round_player: RoundPlayer | None = None) -> ShrinkResult:
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
    if settings.batch < 1:
        raise ShrinkError(f"--batch {settings.batch}: expected a whole number >= 1")

    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    out_dir = Path(out) / f"shrink-{stored.directory.name}-{stamp}"
    (out_dir / "attempts").mkdir(parents=True)
    shutil.copyfile(stored.scenario_path, out_dir / "scenario.toml")
    result = ShrinkResult(out_dir, stored.plan, stored.plan, target)
    stop = threading.Event()  # set by SIGINT/SIGTERM during a run (harness/run.py installs the handler)
    keeper = None
    if round_player is None:
        if player is None and settings.keep_topology:
            from harness.local.keeper import TopologyKeeper

            keeper = TopologyKeeper(out_dir / "kept-topology")
        round_player = RoundPlayer(out_dir / "scenario.toml", settings, player, keeper=keeper)
    result.best_report = stored.report
    began = time.monotonic()
    log(f"shrinking {stored.directory} ({plan_size(stored.plan)}); target: fails "
        f"{', '.join(sorted(target))} in {settings.runs} runs; budget {settings.budget_s:g} s, "
        f"at most {settings.max_attempts} attempts, {settings.batch} candidates per check")

    try:
        _search(result, settings, stored, round_player, stop, log)
    except KeyboardInterrupt:
        result.stop_reason = "interrupted (SIGINT/SIGTERM); the smallest plan so far is kept"
    finally:
        if keeper is not None:
            result.topology_fallbacks = list(keeper.fallbacks)
            try:
                keeper.close()
            except Exception as error:  # noqa: BLE001 - its nodes die with their process groups anyway
                log(f"stopping the kept topology: {error}")
    result.replay = replay_command(out_dir)
    result.check_calls = list(round_player.check_calls)
    _write_outputs(result, settings, stored)
    log(f"stopped: {result.stop_reason}")
    log(f"original: {plan_size(result.original)}")
    log(f"minimal:  {plan_size(result.minimal)}  ({len(result.attempts)} attempts, "
        f"{time.monotonic() - began:.0f} s)")
    log(f"shrunk plan: {out_dir / 'shrunk-plan.json'}")
    log(f"replay: {result.replay}")
    return result


def _search(result: ShrinkResult, settings: ShrinkSettings, stored: StoredRun, player: RoundPlayer,
            stop: threading.Event, log: Callable[[str], None]) -> None:
    began = time.monotonic()
    run_estimate = _measured_run_seconds(stored) or FIRST_RUN_GUESS_S
    measured: list[float] = []
    tried = {_fingerprint(stored.plan)}
    start_chunks: dict[str, int] = {}
    while not result.stop_reason:
        accepted = None
        pending = candidates(result.minimal, start_chunks)
        while accepted is None and not result.stop_reason:
            round_: list = []
            for candidate in pending:
                fingerprint = _fingerprint(candidate.plan)
                if fingerprint in tried:
                    continue
                if len(result.attempts) + len(round_) >= settings.max_attempts:
                    result.stop_reason = f"--max-attempts {settings.max_attempts} reached"
                    break
                remaining = settings.budget_s - (time.monotonic() - began)
                # Why: a candidate needs up to N runs; never start one the budget cannot pay for.
                needed = run_estimate * settings.runs.total * (len(round_) + 1)
                if remaining < needed:
                    if not round_:
                        result.stop_reason = (f"budget: {remaining:.0f} s left, a candidate needs about "
                                              f"{run_estimate * settings.runs.total:.0f} s")
                    break  # else: the round ends here, the next one asks the budget again
                tried.add(fingerprint)
                round_.append(candidate)
                if len(round_) >= settings.batch:
                    break
            if not round_:
                if not result.stop_reason:
                    result.stop_reason = "minimal: no smaller candidate reproduces the failure"
                return
            attempts, winner = _try_round(round_, len(result.attempts) + 1, settings, result.target,
                                          result.out_dir / "attempts", player, stop)
            for attempt, runs in attempts:
                result.attempts.append(attempt)
                measured += [p.seconds for p in runs]
                reproduced = attempt.matched >= settings.runs.needed
                log(f"attempt {attempt.number:>3}  {attempt.size:<70}  "
                    f"{'FAILS' if reproduced else 'passes'} {attempt.matched}/{attempt.runs}  "
                    f"{attempt.seconds:>5.0f} s  {attempt.description}"
                    + ("  (taken: the first of its round to fail)" if attempt.accepted else ""))
            if measured:
                run_estimate = max(measured)  # the slowest run so far: the estimate errs on the safe side
            if stop.is_set():
                result.stop_reason = "interrupted (SIGINT/SIGTERM); the smallest plan so far is kept"
                return
            if winner is not None:
                accepted = round_[winner]
                result.best_report = next(p.report for p in attempts[winner][1] if matches(p, result.target))
            elif result.stop_reason.startswith("--max-attempts"):
                return
        if accepted is None:
            return
        result.minimal = accepted.plan
        start_chunks[accepted.dimension] = max(2, accepted.chunks)


def _try_round(round_: list, first_number: int, settings: ShrinkSettings, target: frozenset[str],
               attempts_dir: Path, player: RoundPlayer, stop: threading.Event
               ) -> tuple[list[tuple[Attempt, list[Played]]], int | None]:
    """Run every candidate of the round, check them in one call, repeat for the undecided ones (K of N);
    returns each candidate's attempt and runs, and the index of the first accepted one (None: none)."""
    runs: list[list[Played]] = [[] for _ in round_]
    matched = [0] * len(round_)
    seconds = [0.0] * len(round_)
    decided: list[bool | None] = [None] * len(round_)  # True accepted, False rejected, None undecided
    for _ in range(settings.runs.total):
        # Why only up to the first accepted one: a later candidate can no longer win the round.
        first = next((i for i, d in enumerate(decided) if d), len(round_))
        todo = [i for i in range(first) if decided[i] is None]
        if not todo or stop.is_set():
            break
        played = []
        for i in todo:
            began = time.monotonic()
            played.append(player.run(round_[i].plan, attempts_dir, stop))
            seconds[i] += time.monotonic() - began
            if stop.is_set():
                break
        began = time.monotonic()
        checked = player.check(played)
        check_share = (time.monotonic() - began) / max(len(checked), 1)
        for i, one in zip(todo, checked, strict=False):
            runs[i].append(one)
            seconds[i] += check_share
            matched[i] += matches(one, target)
            left = settings.runs.total - len(runs[i])
            if matched[i] >= settings.runs.needed:
                decided[i] = True
            elif matched[i] + left < settings.runs.needed:
                decided[i] = False
    winner = next((i for i, d in enumerate(decided) if d), None)
    if winner is not None and any(d is None for d in decided[:winner]):
        winner = None  # interrupted before an earlier candidate was decided: no winner is sure
    out = []
    for i, candidate in enumerate(round_):
        if not runs[i]:
            continue  # never run (a later candidate after the winner, or interrupted)
        out.append((Attempt(
            number=first_number + len(out), description=candidate.description, dimension=candidate.dimension,
            size=str(plan_size(candidate.plan)), accepted=i == winner, matched=matched[i],
            runs=len(runs[i]), failing=tuple(tuple(sorted(p.failing)) for p in runs[i]),
            exit_codes=tuple(p.exit_code for p in runs[i]), run_dirs=tuple(str(p.run_dir) for p in runs[i]),
            seconds=round(seconds[i], 1)), runs[i]))
    if winner is not None:
        winner = sum(1 for i in range(winner) if runs[i])  # its index among the returned attempts
    return out, winner


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
        "batch": settings.batch,
        "check_calls": result.check_calls,
        "topology_fallbacks": result.topology_fallbacks,
        "attempts": [asdict(a) for a in result.attempts],
    }, indent=2) + "\n")
