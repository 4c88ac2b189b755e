"""Explore: run new seeds of a scenario until a time budget is spent; keep every failure in a corpus.

Budget rule: a run is started only when ``duration_s + overhead`` fits in what is left, where overhead is
the largest measured (wall time - workload duration) of this exploration's runs (before the first:
the scenario's drain_quiet_s + FIRST_RUN_OVERHEAD_S, which covers topology start/stop and the first Spark
check).  A run that still overruns (a drain that waits for its timeout) is cut at the deadline: it ends
as interrupted, its verdict unknown ("cut by the budget"), never a pass.  A cut run is not checked; a run
whose run phase ends just before the deadline still is, so the worst overrun is one check.

Checks overlap the next seed (``overlap_checks``, the default): a seed's run ends with its topology
stopped and its history written, then the next seed starts at once while a background thread checks every
finished run waiting for it in one Spark job (``pipeline.check_and_record``: one job for the batch, one
fixed cost).  Only the Spark check of seed N, which reads seed N's stored history and nothing live, runs
beside seed N+1.  What it costs: the check's CPU is taken from the next seed's workload (2 cores here),
which a scenario's tolerances must absorb like any other load.

The topology is kept between seeds (``keep_topology``, the default; harness/local/keeper.py): after a seed its
broker nodes stop, every fault is healed, the Redis Cluster's node -> role map is restored, every key is
flushed, Tansu and its S3 server restart on an empty store, and all of that is verified (DBSIZE 0 on every
node, cluster healthy, the fresh start's role map, no network rule, Kafka's topic list of a fresh start)
before the next seed starts its own broker nodes on it.  Whatever cannot be verified makes the next seed
start a fresh topology, with the reason in its summary.json (``topology_reuse``) and in the closing lines.
``--fresh-topology`` starts and stops a topology per seed; ``--serial-checks`` checks each seed before the next
starts.
The budget rule then also keeps room for the last check: duration + the worst measured run overhead +
the worst measured check.

Corpus layout (``--corpus DIR``):
  <scenario>-<seed>/   plan.json scenario.toml report.json entry.json  (one per failing run; replayable
                       with ``ordeal replay <entry>``; entry.json holds the replay commands, the failing
                       invariants and the first witness)
  explored.jsonl       every run: scenario, seed, exit code, run dir (the next exploration starts after
                       the highest seed explored)
  unknowns.jsonl       every unknown (exit 2) run with its reasons

Shards (``--shard K/N``, ordeal/shard.py): shard K of N runs only the seeds s with s % N == K - 1, from the
first of them at or after the start (``--seed-start``, or one after the highest seed in the corpus), each next
one N further on.  Every exploration appends itself to ``<out>/explore-summary.json`` (``write_summary``:
schema version, the shard, per scenario the seeds run with each one's verdict and exit code, the failing
entries, paths relative to ``<out>``), which ``ordeal merge`` (ordeal/merge.py) reads.

Promotion (``ordeal explore --promote ENTRY``) copies an entry to tests/data/regressions/<entry>/ with an
expect.json; tests/integration/test_explore_regressions.py replays each one in the smoke tier.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import harness.model  # noqa: F401  (registers the stages into the scenario model)
from contracts.errors import UsageError
from contracts.exit_codes import EXIT_FAIL, EXIT_PASS, EXIT_UNKNOWN
from contracts.scenario import load_scenario
from ordeal.replay import Played, first_witness, play, replay_command
from ordeal.shard import WHOLE, Shard
from properties.generate import make_plan

# a run's overhead before any was measured: topology start and stop and a cold Spark check on a busy machine,
# the check by far the largest part (docs/measurements.md)
FIRST_RUN_OVERHEAD_S = 60.0
REGRESSIONS_DIR = Path(__file__).resolve().parent.parent / "tests" / "data" / "regressions"
SUMMARY_NAME = "explore-summary.json"  # in --out: every exploration written there (write_summary)
# its schema_version (docs/schemas/explore-summary.schema.json); ordeal merge refuses one it does not know
EXPLORE_SUMMARY_VERSION = 1


class ExploreError(UsageError):
    """Bad explore input; the message names the file or option and what is expected."""


@dataclass(frozen=True)
class ExploreSettings:
    budget_s: float
    corpus: Path
    out: Path
    seed_start: int | None = None  # None: one after the highest seed of this scenario in the corpus
    spark_master: str | None = None
    overlap_checks: bool = True  # check finished seeds in the background, batched, while the next one runs
    keep_topology: bool = True  # one topology for every seed, reset and verified between them (harness/local/keeper.py)
    topology_spares: int = 1  # kept topologies reset in the background while a seed runs on another; 0 = in line
    shard: Shard = WHOLE  # only the seeds of this shard (ordeal/shard.py)


@dataclass(frozen=True)
class ExploredRun:
    seed: int
    exit_code: int
    run_dir: str
    seconds: float
    faults_planned: int
    faults_applied: int
    failing: tuple[str, ...]
    unknown: tuple[str, ...]  # reasons
    entry: str | None  # the corpus entry (failing runs)
    phases: tuple[tuple[str, float], ...] = ()  # where the run's wall time went (overhead_phases)
    check_overlapped: bool = False  # its check ran beside the next seed: not part of the run's wall time
    topology: str = "fresh"  # "kept" (reset and verified after the seed before) or "fresh"


# A run's wall time by phase, from its summary.json timings: everything but the workload is overhead.
PHASES = (("topology start", ("target_start_s",)), ("workload", ("workload_s",)),
          ("heal + drain", ("heal_all_s", "drain_s", "snapshot_s", "kafka_backlog_s")),
          ("topology stop", ("target_stop_s",)), ("topology reset", ("topology_reset_s",)), ("check", ("check_s",)))


def overhead_phases(summary: dict[str, Any], wall_s: float, overlapped: bool = False) -> tuple[tuple[str, float], ...]:
    """(phase, seconds) for one run, plus "other" (plan, history writing, reports: the rest of the wall time).
    An overlapped check ran beside the next seed, outside ``wall_s``: reported, not subtracted."""
    timings = summary.get("timings_s") or {}
    phases = [(name, round(sum(float(timings.get(k) or 0.0) for k in keys), 2)) for name, keys in PHASES]
    inside = sum(v for name, v in phases if not (overlapped and name == "check"))
    return (*phases, ("other", round(max(0.0, wall_s - inside), 2)))


@dataclass
class ExploreResult:
    scenario: str
    runs: list[ExploredRun] = field(default_factory=list)
    stop_reason: str = ""
    started: float = field(default_factory=time.monotonic)
    elapsed_s: float = 0.0
    check_batches: list[tuple[int, float]] = field(default_factory=list)  # overlapped checks: (runs, seconds)
    topology_fallbacks: list[str] = field(default_factory=list)  # why a kept topology was given up
    topology_resets: list[float] = field(default_factory=list)  # seconds of each reset between seeds
    topology_spares: int = 0  # >0: the resets ran in the background, beside the next seed
    shard: Shard = WHOLE
    first_seed: int | None = None

    @property
    def exit_code(self) -> int:
        """1 any failing run, else 2 any unknown run — or no run at all (nothing explored is no pass)."""
        if not self.runs:
            return EXIT_UNKNOWN
        if any(r.exit_code == EXIT_FAIL for r in self.runs):
            return EXIT_FAIL
        return EXIT_UNKNOWN if any(r.exit_code not in (EXIT_PASS, EXIT_FAIL) for r in self.runs) else EXIT_PASS


def start_seed(settings: ExploreSettings, scenario: str) -> int:
    """The exploration's first seed: the shard's first seed at or after --seed-start, or after the highest seed
    of ``scenario`` in the corpus (then every next one ``settings.shard.n`` further on)."""
    start = settings.seed_start if settings.seed_start is not None else next_seed(settings.corpus, scenario)
    return settings.shard.first_seed(start)


def next_seed(corpus: Path, scenario: str) -> int:
    seeds = [r["seed"] for r in _read_jsonl(corpus / "explored.jsonl") if r.get("scenario") == scenario]
    return max(seeds, default=0) + 1


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise ExploreError(f"{path}:{number}: not a JSON line ({error}); fix or remove that line") from error
    return rows


def _append_jsonl(path: Path, row: dict[str, Any]) -> None:
    with path.open("a") as handle:
        handle.write(json.dumps(row, sort_keys=True) + "\n")


def estimate_run_s(duration_s: float, drain_quiet_s: float, overheads: list[float],
                   checks: list[float] | None = None) -> float:
    """Wall time a run is expected to need (see the module's budget rule).  Before the first run the guess
    is high on purpose: even with a Spark session already up, the first check in a JVM is slow.
    ``checks`` (overlapped checks only): the measured check batches; the last run's check still has to fit,
    so the worst of them is added (before any was measured: the first-run guess)."""
    if checks is None:
        return duration_s + (max(overheads) if overheads else drain_quiet_s + FIRST_RUN_OVERHEAD_S)
    if not overheads:
        return duration_s + drain_quiet_s + FIRST_RUN_OVERHEAD_S
    return duration_s + max(overheads) + (max(checks) if checks else FIRST_RUN_OVERHEAD_S)


class BackgroundChecker:
    """Checks finished runs in a thread of its own while the next seed runs: every run waiting when the
    thread is free goes into one ``check_and_record`` call (one Spark job for the batch).  Finished checks are
    taken by the explore loop (``take``) in the order they were submitted."""

    def __init__(self, spark_master: str | None = None, check=None):
        from ordeal import pipeline

        self._check = check or (lambda dirs: pipeline.check_and_record(dirs, spark_master=spark_master))
        self._cond = threading.Condition()
        self._waiting: list[tuple[Played, Any]] = []
        self._done: list[tuple[Played, Any]] = []
        self._running = 0
        self._closed = False
        self.batches: list[tuple[int, float]] = []  # (runs, seconds) per check job
        self._thread = threading.Thread(target=self._work, name="explore-checker", daemon=True)
        self._thread.start()

    def submit(self, played: Played, plan) -> None:
        with self._cond:
            self._waiting.append((played, plan))
            self._cond.notify_all()

    def take(self) -> list[tuple[Played, Any]]:
        with self._cond:
            done, self._done = self._done, []
        return done

    def pending(self) -> int:
        with self._cond:
            return len(self._waiting) + self._running

    def close(self) -> list[tuple[Played, Any]]:
        """Wait for every submitted run's check; return what was not taken yet."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()
        return self.take()

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self._closed:
                    self._cond.wait()
                if not self._waiting:
                    return
                # Why all at once: a check's cost is mostly fixed (jobs, stages), so the runs that queued up
                # while the last check ran share one job instead of each paying it.
                batch, self._waiting = self._waiting, []
                self._running = len(batch)
            started = time.monotonic()
            try:
                checked = self._check([played.run_dir for played, _ in batch])
                results = [(Played(played.run_dir, item.exit_code, item.report, played.seconds, item.summary), plan)
                           for (played, plan), item in zip(batch, checked, strict=True)]
            except Exception as error:  # noqa: BLE001 - a broken check is an unknown run, never a lost one
                results = [(Played(played.run_dir, 2, None, played.seconds,
                                   {**played.summary, "check": f"the checker failed: {type(error).__name__}: {error}",
                                    "checked": False}), plan) for played, plan in batch]
            with self._cond:
                self.batches.append((len(batch), time.monotonic() - started))
                self._done.extend(results)
                self._running = 0
                self._cond.notify_all()


def explore(scenario_path: Path, settings: ExploreSettings, log: Callable[[str], None] = print) -> ExploreResult:
    scenario = load_scenario(scenario_path)  # ScenarioError names the file and key
    settings.corpus.mkdir(parents=True, exist_ok=True)
    seed = start_seed(settings, scenario.name)
    result = ExploreResult(scenario.name, shard=settings.shard, first_seed=seed)
    deadline = time.monotonic() + settings.budget_s
    log(f"exploring {scenario.name} from seed {seed}"
        + ("" if settings.shard.whole else f" (shard {settings.shard}: the seeds s % {settings.shard.n} == {settings.shard.k - 1})")
        + f", budget {settings.budget_s:g} s, corpus {settings.corpus}")
    try:
        _loop(result, scenario, scenario_path, settings, seed, deadline, log)
    except KeyboardInterrupt:
        result.stop_reason = "interrupted (SIGINT/SIGTERM)"
    result.elapsed_s = time.monotonic() - result.started
    log(f"stopped: {result.stop_reason}")
    return result


def _loop(result: ExploreResult, scenario, scenario_path: Path, settings: ExploreSettings, seed: int,
          deadline: float, log: Callable[[str], None]) -> None:
    checker = BackgroundChecker(settings.spark_master) if settings.overlap_checks else None
    keeper = None
    if settings.keep_topology:
        import datetime

        from harness.local.keeper import TopologyKeeper

        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        keeper = TopologyKeeper(settings.out / f"kept-topology-{scenario.name}-{stamp}",
                                spares=settings.topology_spares)
    try:
        _seeds(result, scenario, scenario_path, settings, seed, deadline, log, checker, keeper)
    finally:
        if keeper is not None:
            try:
                keeper.close()
            except Exception as error:  # noqa: BLE001 - its nodes die with their process groups anyway
                log(f"stopping the kept topology: {error}")
            result.topology_fallbacks = list(keeper.fallbacks)
            result.topology_resets = list(keeper.resets)
            result.topology_spares = keeper.spares
        if checker is not None:
            for played, plan in checker.close():  # the last seeds' checks (the budget kept room for one)
                _log_run(result, _record(played, plan, scenario_path, settings.corpus, cut=False, overlapped=True),
                         log)
            result.check_batches = list(checker.batches)


def _seeds(result: ExploreResult, scenario, scenario_path: Path, settings: ExploreSettings, seed: int,
           deadline: float, log: Callable[[str], None], checker: BackgroundChecker | None,
           keeper=None) -> None:
    duration = scenario.scenario.duration_s
    overheads: list[float] = []
    while True:
        if checker is not None:
            for played, plan in checker.take():
                _log_run(result, _record(played, plan, scenario_path, settings.corpus, cut=False, overlapped=True),
                         log)
        remaining = deadline - time.monotonic()
        checks = None if checker is None else [seconds for _, seconds in checker.batches]
        needed = estimate_run_s(duration, scenario.scenario.drain_quiet_s, overheads, checks)
        # Why: never start a run that cannot finish inside the budget (the estimate errs high).
        if remaining < needed:
            result.stop_reason = f"budget: {remaining:.0f} s left, a run needs about {needed:.0f} s"
            break
        plan = make_plan(scenario, seed)
        stop = threading.Event()
        cutter = threading.Timer(max(0.0, remaining), stop.set)
        cutter.daemon = True
        cutter.start()
        try:
            played = play(scenario_path, plan, settings.out, stop=stop, spark_master=settings.spark_master,
                          check=checker is None, keeper=keeper)
        finally:
            cutter.cancel()
        overheads.append(max(0.0, played.seconds - duration))
        cut = stop.is_set() and time.monotonic() >= deadline - 1.0
        if checker is not None and not cut and played.summary.get("history_complete"):
            checker.submit(played, plan)  # checked beside the next seed
        else:  # checked already (serial), or never checked (cut, incomplete history: unknown)
            _log_run(result, _record(played, plan, scenario_path, settings.corpus, cut=cut), log)
        seed += settings.shard.n  # the shard's next seed (1/1: the next seed)
        if stop.is_set() and not cut:  # SIGINT/SIGTERM during the run: the user wants to stop
            result.stop_reason = "interrupted (SIGINT/SIGTERM)"
            break


def _log_run(result: ExploreResult, explored: ExploredRun, log: Callable[[str], None]) -> None:
    result.runs.append(explored)
    log(f"seed {explored.seed:>6}  exit {explored.exit_code}  {explored.seconds:>5.0f} s  faults "
        f"{explored.faults_applied}/{explored.faults_planned}  "
        + (f"FAILS {', '.join(explored.failing)}  -> {explored.entry}" if explored.failing else
           f"unknown: {'; '.join(explored.unknown)[:150]}" if explored.exit_code != 0 else "pass"))


def _record(played: Played, plan, scenario_path: Path, corpus: Path, *, cut: bool,
            overlapped: bool = False) -> ExploredRun:
    report = played.report
    failing = tuple(sorted(played.failing))
    unknown = _unknown_reasons(played, cut)
    faults = (report or {}).get("faults") or []
    entry = _write_entry(played, plan, scenario_path, corpus) if played.exit_code == 1 else None
    explored = ExploredRun(
        seed=plan.seed, exit_code=played.exit_code, run_dir=str(played.run_dir), seconds=played.seconds,
        faults_planned=len(plan.faults), faults_applied=sum(1 for f in faults if not f.get("error")),
        failing=failing, unknown=unknown if played.exit_code == 2 else (), entry=str(entry) if entry else None,
        phases=overhead_phases(played.summary, played.seconds, overlapped=overlapped), check_overlapped=overlapped,
        topology="kept" if (played.summary.get("topology_reuse") or {}).get("kept") else "fresh")
    row = {"scenario": plan.scenario, **asdict(explored)}
    _append_jsonl(corpus / "explored.jsonl", row)
    if played.exit_code == 2:
        _append_jsonl(corpus / "unknowns.jsonl", row)
    return explored


def _unknown_reasons(played: Played, cut: bool) -> tuple[str, ...]:
    reasons = []
    if cut:
        reasons.append("cut by the budget: the run overran its estimate and was interrupted")
    if played.summary.get("error"):
        reasons.append(str(played.summary["error"]))
    if isinstance(played.summary.get("check"), str) and not played.summary.get("checked"):
        reasons.append(f"check: {played.summary['check']}")
    for item in (played.report or {}).get("invariants", []):
        if item.get("verdict") == "unknown":
            reasons.append(f"{item['id']}: {item.get('reason') or 'unknown'}")
    return tuple(reasons) or (("no report.json",) if played.report is None else ())


def _write_entry(played: Played, plan, scenario_path: Path, corpus: Path) -> Path:
    entry = corpus / f"{plan.scenario}-{plan.seed}"
    if entry.exists():  # the same seed explored again (e.g. --seed-start): keep both
        entry = corpus / f"{plan.scenario}-{plan.seed}-{played.run_dir.name.rsplit('-', 1)[-1]}"
    entry.mkdir(parents=True)
    shutil.copyfile(played.run_dir / "scenario.toml", entry / "scenario.toml")
    shutil.copyfile(played.run_dir / "plan.json", entry / "plan.json")
    shutil.copyfile(played.run_dir / "report.json", entry / "report.json")
    (entry / "entry.json").write_text(json.dumps({
        "scenario": plan.scenario,
        "seed": plan.seed,
        "run_dir": str(played.run_dir),
        "failing": sorted(played.failing),
        "first_witness": first_witness(played.report),
        "replay": replay_command(entry),
        "rerun": shlex.join(["ordeal", "run", str(scenario_path), "--seed", str(plan.seed)]),
        "shrink": shlex.join(["ordeal", "shrink", str(played.run_dir)]),
    }, indent=2, default=str) + "\n")
    return entry


def summary_lines(result: ExploreResult) -> list[str]:
    """The closing table: one row per run, then the totals."""
    lines = [f"{'seed':>6}  {'exit':>4}  {'secs':>5}  {'faults':>9}  result"]
    for r in result.runs:
        outcome = ("FAIL " + ", ".join(r.failing)) if r.failing else (
            "unknown: " + "; ".join(r.unknown)[:100] if r.exit_code != 0 else "pass")
        lines.append(f"{r.seed:>6}  {r.exit_code:>4}  {r.seconds:>5.0f}  "
                     f"{f'{r.faults_applied}/{r.faults_planned}':>9}  {outcome}")
    lines += throughput_lines(result)
    failed_invariants = sorted({i for r in result.runs for i in r.failing})
    lines.append(
        f"runs {len(result.runs)}  faults applied {sum(r.faults_applied for r in result.runs)}  "
        f"failing runs {sum(1 for r in result.runs if r.exit_code == 1)}  invariants failed "
        f"{len(failed_invariants)}{' (' + ', '.join(failed_invariants) + ')' if failed_invariants else ''}  "
        f"unknowns {sum(1 for r in result.runs if r.exit_code not in (0, 1))}  exit {result.exit_code}")
    return lines


def throughput_lines(result: ExploreResult) -> list[str]:
    """Faulted runs per hour and where each run's time went (the nightly's figures).  The overhead per run is
    what delays the next seed: everything but the workload, less an overlapped check (it runs beside the next
    seed; its batches are listed on their own line)."""
    lines: list[str] = []
    if result.runs:
        faulted = sum(1 for r in result.runs if r.faults_applied > 0)
        hours = max(result.elapsed_s, sum(r.seconds for r in result.runs)) / 3600
        lines.append(f"throughput: {len(result.runs) / hours:.0f} runs/hour, {faulted / hours:.0f} faulted runs/hour "
                     f"({faulted} of {len(result.runs)} runs had a fault applied)")
        mean = {name: sum(dict(r.phases).get(name, 0.0) for r in result.runs) / len(result.runs)
                for name, _ in (*PHASES, ("other", ()))}
        if len(result.runs) > 1:  # the steady state: every run but the first (which starts the topologies)
            pace = sum(r.seconds for r in result.runs[1:]) / (len(result.runs) - 1)
            lines.append(f"pace: a seed every {pace:.1f} s -> {3600 / pace:.0f} runs/hour while the checks keep up")
        overlapped = sum(1 for r in result.runs if r.check_overlapped)
        in_line = {k: v for k, v in mean.items()
                   if k != "workload" and not (k == "check" and overlapped == len(result.runs))}
        lines.append("per run (mean s): " + "  ".join(f"{k} {v:.1f}" for k, v in mean.items())
                     + f"  -> overhead {sum(in_line.values()):.1f} s per run"
                     + (" (the check overlapped with the next seed)" if overlapped == len(result.runs) else ""))
    if result.runs:
        kept = sum(1 for r in result.runs if r.topology == "kept")
        resets = result.topology_resets
        lines.append(f"topology: kept (reset and verified) for {kept} of {len(result.runs)} runs, "
                     f"{len(result.runs) - kept} started fresh"
                     + (f"; {len(resets)} resets, {sum(resets) / len(resets):.1f} s each, "
                        + ("in the background beside the next seed" if result.topology_spares else "in line")
                        if resets else "")
                     + (f"; given up {len(result.topology_fallbacks)} time(s): "
                        + " | ".join(reason[:200] for reason in result.topology_fallbacks)
                        if result.topology_fallbacks else ""))
    if result.check_batches:
        runs = sum(n for n, _ in result.check_batches)
        seconds = sum(s for _, s in result.check_batches)
        lines.append(f"checks: {runs} runs in {len(result.check_batches)} Spark jobs, {seconds:.0f} s in all "
                     f"({seconds / max(runs, 1):.1f} s per run), beside the next seeds")
    return lines


def check_summary_shard(out: Path, shard: Shard) -> None:
    """Refuse to add this shard's exploration to an ``<out>/explore-summary.json`` of another shard (one
    directory is one shard's output); checked before exploring."""
    existing = _read_summary(out / SUMMARY_NAME)
    if existing is not None and existing.get("shard") != shard.to_dict():
        raise ExploreError(f"{out / SUMMARY_NAME}: holds shard {existing.get('shard')}, not --shard {shard}; "
                           "give each shard its own --out")


def _read_summary(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        document = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ExploreError(f"{path}: not JSON ({error}); remove it or use another --out") from error
    if not isinstance(document, dict) or document.get("schema_version") != EXPLORE_SUMMARY_VERSION:
        raise ExploreError(f"{path}: schema_version {(document or {}).get('schema_version')!r} is not "
                           f"{EXPLORE_SUMMARY_VERSION}; remove it or use another --out")
    return document


def exploration_record(result: ExploreResult, settings: ExploreSettings, scenario_path: Path) -> dict[str, Any]:
    """One exploration as explore-summary.json keeps it; paths relative to ``settings.out``."""
    def rel(path: str | Path | None) -> str | None:
        return None if path is None else os.path.relpath(path, settings.out)

    verdicts = {EXIT_PASS: "pass", EXIT_FAIL: "fail"}
    return {
        "scenario": result.scenario, "scenario_path": str(scenario_path), "corpus": rel(settings.corpus),
        "first_seed": result.first_seed, "budget_s": settings.budget_s, "elapsed_s": round(result.elapsed_s, 2),
        "stop_reason": result.stop_reason, "exit_code": result.exit_code,
        "verdict": verdicts.get(result.exit_code, "unknown"),
        "seeds": [r.seed for r in result.runs],
        "runs": [{"seed": r.seed, "exit_code": r.exit_code, "verdict": verdicts.get(r.exit_code, "unknown"),
                  "seconds": round(r.seconds, 2), "run_dir": rel(r.run_dir), "failing": list(r.failing),
                  "unknown": list(r.unknown), "entry": rel(r.entry)} for r in result.runs],
        "failing_entries": [rel(r.entry) for r in result.runs if r.entry],
    }


def write_summary(result: ExploreResult, settings: ExploreSettings, scenario_path: Path) -> Path:
    """Append this exploration to ``<out>/explore-summary.json`` (created with the shard on first use)."""
    path = settings.out / SUMMARY_NAME
    document = _read_summary(path) or {"schema_version": EXPLORE_SUMMARY_VERSION, "kind": "explore",
                                       "shard": settings.shard.to_dict(), "explorations": []}
    if document.get("shard") != settings.shard.to_dict():
        raise ExploreError(f"{path}: holds shard {document.get('shard')}, not --shard {settings.shard}; "
                           "give each shard its own --out")
    document["explorations"].append(exploration_record(result, settings, scenario_path))
    settings.out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2, default=str) + "\n")
    return path


def promote(entry: Path, regressions: Path = REGRESSIONS_DIR, expect: str = "fail") -> Path:
    """Copy a corpus entry into the smoke tier's regression list (see the module docstring)."""
    entry = Path(entry)
    meta_path = entry / "entry.json"
    if not meta_path.is_file():
        raise ExploreError(f"{entry}: not a corpus entry (no entry.json); pass a directory under the corpus, "
                           "e.g. runs/corpus/<scenario>-<seed>")
    if expect not in ("fail", "pass"):
        raise ExploreError(f"--expect {expect!r}: expected 'fail' (the suite must keep catching it) or 'pass' "
                           "(a fixed bug must stay fixed)")
    meta = json.loads(meta_path.read_text())
    target = regressions / entry.name
    if target.exists():
        raise ExploreError(f"{target}: already promoted; remove it first to promote again")
    target.mkdir(parents=True)
    for name in ("scenario.toml", "plan.json"):
        shutil.copyfile(entry / name, target / name)
    (target / "expect.json").write_text(json.dumps({
        "expect": expect,
        "invariants": meta.get("failing", []) if expect == "fail" else [],
        "promoted_from": str(entry),
        "first_witness": meta.get("first_witness"),
    }, indent=2, default=str) + "\n")
    return target
