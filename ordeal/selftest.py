"""Self-verification: the defect detection matrix, the false-alarm budget and black-box findings.

The matrix (selftest/matrix.toml) names, for every defect of the reference broker's catalog, a fixed
scenario + seed and the invariant(s) that must fail when the defect is switched on.  ``run_selftest``
runs every job sequentially (the defect runs, the same scenarios with the correct broker, the repeated
correct runs of the false-alarm budget, the black-box runs), then checks all of them in ONE Spark job
(``spark_checkers.api.check_runs``: start-up costs 7-11 s, so it is paid once), judges each run against
its expectation and writes ``selftest.json`` and ``selftest.html``.

Exit code: 1 when a covered defect was missed or a correct run had a violation; else 2 when anything is
unknown (a run or invariant undecided, a catalog defect without an entry in the full tier); else 0.
"""

from __future__ import annotations

import html
import json
import math
import statistics
import time
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from contracts.versions import read_json

TIERS = ("smoke", "full")
ROLES = ("defect", "correct", "false_alarm", "blackbox")
# outcome of one judged run
CAUGHT, MISSED, PASSED, VIOLATION, UNKNOWN, FINDING = "caught", "missed", "pass", "violation", "unknown", "finding"
EXIT_OK, EXIT_FAIL, EXIT_UNKNOWN = 0, 1, 2
REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MATRIX = REPO_ROOT / "selftest" / "matrix.toml"
NEED_FRACTION = 0.8  # an entry's default: ceil(0.8 x seeds) must catch the defect (4 of 5)


class MatrixError(ValueError):
    """The matrix file is wrong; the message names the file, the key and what is expected."""


@dataclass(frozen=True)
class MatrixEntry:
    """One defect in one tier: its scenario, the seeds it is run with, the invariants that must fail and how
    many of the seeds must catch it (``need``; default 4 of 5, i.e. ceil(0.8 x seeds))."""

    defect: str
    scenario: Path
    seeds: tuple[int, ...]
    expect: tuple[str, ...]
    tier: str
    need: int = 1

    @property
    def seed(self) -> int:
        return self.seeds[0]


@dataclass(frozen=True)
class FalseAlarmSpec:
    scenarios: tuple[Path, ...] = ()
    repeat: int = 3
    seed_start: int = 100


@dataclass(frozen=True)
class BlackboxSpec:
    scenarios: tuple[Path, ...] = ()
    seed: int = 1


@dataclass(frozen=True)
class Matrix:
    source: str
    entries: tuple[MatrixEntry, ...]
    false_alarm: FalseAlarmSpec = FalseAlarmSpec()
    blackbox: BlackboxSpec = BlackboxSpec()

    def uncovered(self, catalog: Mapping[str, Any]) -> tuple[str, ...]:
        """Catalog defects without a full-tier entry (the detection matrix proper)."""
        covered = {e.defect for e in self.entries if e.tier == "full"}
        return tuple(name for name in catalog if name not in covered)


@dataclass(frozen=True)
class Job:
    """One run to do: a defect run, a correct run of a matrix scenario, a false-alarm repeat or a black-box
    run.  ``label`` is unique and names the run's directory."""

    role: str
    label: str
    scenario: Path
    seed: int
    defect: str | None = None
    expect: tuple[str, ...] = ()
    need: int = 1                  # a defect job: how many of its entry's seeds must catch it


@dataclass(frozen=True)
class Row:
    """One judged run."""

    role: str
    label: str
    scenario: str
    seed: int
    defect: str | None
    expect: tuple[str, ...]
    outcome: str
    verdict: str                   # the run's verdict: pass / fail / unknown
    failed: tuple[str, ...]        # invariants that failed
    unknown: tuple[str, ...]       # invariants that were unknown
    detection_s: float | None      # run start -> first witness of an expected (or, if none, any) failure
    run_s: float | None            # wall time of the run (without the check)
    run_dir: str | None
    witness: str = ""              # the first witness of the deciding invariant, as text
    reason: str = ""               # why unknown / what went wrong
    replay: str = ""
    need: int = 1                  # a defect row: how many of its entry's seeds must catch it


@dataclass
class SelftestResult:
    tier: str
    rows: list[Row] = field(default_factory=list)
    uncovered: tuple[str, ...] = ()
    check_s: float | None = None
    total_s: float | None = None
    errors: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return selftest_exit_code(self.rows, self.uncovered if self.tier == "full" else (), self.errors)


# ----------------------------------------------------------------------------------------------- the matrix

def load_matrix(path: str | Path = DEFAULT_MATRIX, root: Path = REPO_ROOT) -> Matrix:
    path = Path(path)
    try:
        document = tomllib.loads(path.read_text())
    except FileNotFoundError as error:
        raise MatrixError(f"{path}: no such matrix file") from error
    except tomllib.TOMLDecodeError as error:
        raise MatrixError(f"{path}: not valid TOML: {error}") from error
    return parse_matrix(document, source=str(path), root=root)


def parse_matrix(document: Mapping[str, Any], *, source: str, root: Path = REPO_ROOT,
                 catalog: Mapping[str, Any] | None = None, invariant_ids: tuple[str, ...] | None = None,
                 check_files: bool = True) -> Matrix:
    if catalog is None:
        from reference_broker.defects import CATALOG as catalog
    if invariant_ids is None:
        from contracts.invariants import IDS as invariant_ids
    unknown_tables = sorted(set(document) - {"entry", "false_alarm", "blackbox"})
    if unknown_tables:
        raise MatrixError(f"{source}: unknown table(s) {', '.join(unknown_tables)}; allowed: entry, false_alarm, "
                          "blackbox")
    raw_entries = document.get("entry", [])
    if not isinstance(raw_entries, list) or not raw_entries:
        raise MatrixError(f"{source}: needs at least one [[entry]] table (defect, scenario, seed, expect, tier)")
    entries: list[MatrixEntry] = []
    seen: set[tuple[str, str]] = set()
    for index, raw in enumerate(raw_entries):
        where = f"{source}: [[entry]] #{index + 1}"
        _only_keys(raw, {"defect", "scenario", "seed", "seeds", "expect", "tier", "need"}, where)
        defect = _required(raw, "defect", str, where)
        where = f"{where} (defect {defect!r})"
        if defect not in catalog:
            raise MatrixError(f"{where}: defect = {defect!r} is not in the catalog; known: {', '.join(catalog)}")
        tier = raw.get("tier", "full")
        if tier not in TIERS:
            raise MatrixError(f"{where}: tier = {tier!r}: must be one of {', '.join(TIERS)}")
        if (defect, tier) in seen:
            raise MatrixError(f"{where}: defect {defect!r} has a second {tier} entry; one entry per defect and tier")
        seen.add((defect, tier))
        text = _required(raw, "scenario", str, where)
        scenario = _scenario_path(text, root, where, check_files)
        if tier == "full" and scenario.parent != root / "scenarios":
            # the question users ask: does a scenario they run catch it, not one written for the defect
            raise MatrixError(f"{where}: scenario = {text!r}: a full-tier entry must name a shipped scenario "
                              "(scenarios/*.toml, the nightly set), not a selftest-only one")
        seeds = _seeds(raw, where)
        need = raw.get("need", math.ceil(NEED_FRACTION * len(seeds)))
        if not isinstance(need, int) or isinstance(need, bool) or not 1 <= need <= len(seeds):
            raise MatrixError(f"{where}: need = {need!r}: must be a whole number from 1 to the number of seeds "
                              f"({len(seeds)})")
        expect = raw.get("expect")
        if not isinstance(expect, list) or not expect or not all(isinstance(x, str) for x in expect):
            raise MatrixError(f"{where}: expect = {expect!r}: must be a non-empty list of invariant ids")
        bad = [x for x in expect if x not in invariant_ids]
        if bad:
            raise MatrixError(f"{where}: expect has unknown invariant id(s) {', '.join(bad)}; known: "
                              f"{', '.join(invariant_ids)}")
        entries.append(MatrixEntry(defect, scenario, seeds, tuple(expect), tier, need))

    false_alarm = FalseAlarmSpec()
    if "false_alarm" in document:
        raw = document["false_alarm"]
        where = f"{source}: [false_alarm]"
        _only_keys(raw, {"scenarios", "repeat", "seed_start"}, where)
        repeat = raw.get("repeat", 3)
        if not isinstance(repeat, int) or isinstance(repeat, bool) or repeat < 1:
            raise MatrixError(f"{where}: repeat = {repeat!r}: must be a whole number >= 1")
        seed_start = raw.get("seed_start", 100)
        if not isinstance(seed_start, int) or isinstance(seed_start, bool) or seed_start < 0:
            raise MatrixError(f"{where}: seed_start = {seed_start!r}: must be a whole number >= 0")
        false_alarm = FalseAlarmSpec(_scenario_list(raw, where, root, check_files), repeat, seed_start)
    blackbox = BlackboxSpec()
    if "blackbox" in document:
        raw = document["blackbox"]
        where = f"{source}: [blackbox]"
        _only_keys(raw, {"scenarios", "seed"}, where)
        seed = raw.get("seed", 1)
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise MatrixError(f"{where}: seed = {seed!r}: must be a whole number >= 0")
        blackbox = BlackboxSpec(_scenario_list(raw, where, root, check_files), seed)
    return Matrix(source, tuple(entries), false_alarm, blackbox)


def _seeds(raw: Mapping[str, Any], where: str) -> tuple[int, ...]:
    if ("seed" in raw) == ("seeds" in raw):
        raise MatrixError(f"{where}: give either seed = N or seeds = [N, ...] (got "
                          f"{'both' if 'seed' in raw else 'neither'})")
    if "seed" in raw:
        return (_required(raw, "seed", int, where),)
    seeds = raw["seeds"]
    if not isinstance(seeds, list) or not seeds or not all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in seeds) or len(set(seeds)) != len(seeds):
        raise MatrixError(f"{where}: seeds = {seeds!r}: must be a non-empty list of distinct whole numbers >= 0")
    return tuple(seeds)


def _only_keys(raw: Any, allowed: set[str], where: str) -> None:
    if not isinstance(raw, Mapping):
        raise MatrixError(f"{where}: must be a table, got {raw!r}")
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise MatrixError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")


def _required(raw: Mapping[str, Any], key: str, kind: type, where: str) -> Any:
    if key not in raw:
        raise MatrixError(f"{where}: missing key {key!r}")
    value = raw[key]
    if not isinstance(value, kind) or isinstance(value, bool) or (kind is int and value < 0) \
            or (kind is str and not value):
        what = "a whole number >= 0" if kind is int else "a non-empty string"
        raise MatrixError(f"{where}: {key} = {value!r}: must be {what}")
    return value


def _scenario_path(text: str, root: Path, where: str, check_files: bool) -> Path:
    path = Path(text)
    path = path if path.is_absolute() else root / path
    if check_files and not path.is_file():
        raise MatrixError(f"{where}: scenario = {text!r}: no such file ({path})")
    return path


def _scenario_list(raw: Mapping[str, Any], where: str, root: Path, check_files: bool) -> tuple[Path, ...]:
    scenarios = raw.get("scenarios", [])
    if not isinstance(scenarios, list) or not all(isinstance(s, str) and s for s in scenarios):
        raise MatrixError(f"{where}: scenarios = {scenarios!r}: must be a list of scenario file paths")
    return tuple(_scenario_path(s, root, f"{where} scenarios", check_files) for s in scenarios)


# ----------------------------------------------------------------------------------------------- the jobs

def plan_jobs(matrix: Matrix, tier: str, *, repeat: int | None = None, blackbox: bool | None = None,
              defects: tuple[str, ...] = (), seeds: tuple[int, ...] = ()) -> list[Job]:
    """The runs of a tier, in the order they are run: every seed of every entry of the tier, then each
    entry scenario + seed once with the correct broker; full adds the false-alarm repeats and the black-box
    runs.  ``defects``: only these defects' entries of the tier (the other tier's entry when the tier has
    none: a named defect never silently runs nothing), no repeats; ``seeds`` replaces the entries' seeds;
    ``repeat`` the matrix's."""
    if tier not in TIERS:
        raise MatrixError(f"tier {tier!r}: must be one of {', '.join(TIERS)}")
    unknown = [d for d in defects if d not in {e.defect for e in matrix.entries}]
    if unknown:
        raise MatrixError(f"{matrix.source}: no entry for defect(s) {', '.join(unknown)}")
    if defects:
        entries = []
        for name in defects:
            own = [e for e in matrix.entries if e.defect == name]
            entries.append(next((e for e in own if e.tier == tier), own[0]))
    else:
        entries = [e for e in matrix.entries if e.tier == tier]
    if seeds:
        entries = [replace(e, seeds=tuple(seeds), need=min(e.need, len(seeds))) for e in entries]
    jobs = [Job("defect", f"defect-{e.defect}-{seed}", e.scenario, seed, e.defect, e.expect, e.need)
            for e in entries for seed in e.seeds]
    correct_done: set[tuple[Path, int]] = set()
    for entry in entries:
        for seed in entry.seeds:
            key = (entry.scenario, seed)
            if key not in correct_done:
                correct_done.add(key)
                jobs.append(Job("correct", f"correct-{entry.scenario.stem}-{seed}", entry.scenario, seed))
    if tier == "full" and not defects:
        times = matrix.false_alarm.repeat if repeat is None else repeat
        for scenario in matrix.false_alarm.scenarios:
            for i in range(times):
                seed = matrix.false_alarm.seed_start + i
                jobs.append(Job("false_alarm", f"repeat-{scenario.stem}-{seed}", scenario, seed))
    if blackbox if blackbox is not None else (tier == "full" and not defects):
        for scenario in matrix.blackbox.scenarios:
            jobs.append(Job("blackbox", f"blackbox-{scenario.stem}-{matrix.blackbox.seed}", scenario,
                            matrix.blackbox.seed))
    return jobs


def scenario_with_defect(text: str, defect: str) -> str:
    """The scenario TOML with ``defect`` added to ``[broker] defects`` (other keys kept)."""
    import tomli_w

    document = tomllib.loads(text)
    broker = document.setdefault("broker", {})
    defects = list(broker.get("defects", []))
    if defect not in defects:
        defects.append(defect)
    broker["defects"] = defects
    return f"# generated by ordeal selftest: the scenario with defect {defect!r} switched on\n" + \
        tomli_w.dumps(document)


# ----------------------------------------------------------------------------------------------- judging

def judge(job: Job, report: Mapping[str, Any] | None, *, run_s: float | None, run_dir: str | None,
          replay: str = "", run_error: str = "") -> Row:
    """Decide one run.  defect: caught when every expected invariant failed; missed when one passed (or
    was not applicable); unknown otherwise.  correct / false_alarm: pass only when the run passed; any
    failure is a violation.  blackbox: always a finding (what failed is listed)."""
    base = dict(role=job.role, label=job.label, scenario=_relative(job.scenario), seed=job.seed,
                defect=job.defect, expect=job.expect, run_s=run_s, run_dir=run_dir, replay=replay, need=job.need)
    if report is None:
        return Row(**base, outcome=UNKNOWN if job.role != "blackbox" else FINDING, verdict="unknown", failed=(),
                   unknown=(), detection_s=None, reason=run_error or "the run was not checked")
    by_id = {r["id"]: r for r in report.get("invariants", [])}
    failed = tuple(i for i, r in by_id.items() if r.get("verdict") == "fail")
    unknown = tuple(i for i, r in by_id.items() if r.get("verdict") == "unknown")
    verdict = str(report.get("verdict", "unknown"))
    reason = "; ".join(f"{i}: {by_id[i].get('why', '')}" for i in unknown)[:600]
    if job.role == "defect":
        states = [by_id.get(i, {}).get("verdict", "missing") for i in job.expect]
        if all(s == "fail" for s in states):
            outcome = CAUGHT
        elif any(s in ("pass", "not_applicable") for s in states):
            outcome = MISSED
        else:
            outcome = UNKNOWN
            reason = reason or f"expected invariant verdicts: {dict(zip(job.expect, states, strict=True))}"
        deciding = [i for i in job.expect if i in failed] or list(failed)
    elif job.role in ("correct", "false_alarm"):
        outcome = PASSED if verdict == "pass" else VIOLATION if failed else UNKNOWN
        deciding = list(failed)
    else:
        outcome = FINDING
        deciding = list(failed)
    return Row(**base, outcome=outcome, verdict=verdict, failed=failed, unknown=unknown,
               detection_s=detection_time_s(report, deciding), witness=_first_witness(report, deciding),
               reason=reason)


def discount_shared_failures(rows: list[Row]) -> list[Row]:
    """A defect run's catch counts only when the correct broker, on the same scenario and seed, did not fail
    the same expected invariant: otherwise the failure is not the defect's doing, and the row is unknown."""
    correct_failed = {(r.scenario, r.seed): set(r.failed) for r in rows if r.role == "correct"}
    judged = []
    for row in rows:
        shared = sorted(set(row.expect) & correct_failed.get((row.scenario, row.seed), set()))
        if row.role == "defect" and row.outcome == CAUGHT and shared:
            row = replace(row, outcome=UNKNOWN, reason=f"the correct broker fails {', '.join(shared)} on the same "
                                                      "scenario and seed too: the catch is not the defect's doing")
        judged.append(row)
    return judged


def detection_time_s(report: Mapping[str, Any], invariants: list[str]) -> float | None:
    """Run start -> the earliest witness of these invariants, in seconds (history times are µs since the
    run started).  None when no witness carries a time."""
    best: float | None = None
    for item in report.get("invariants", []):
        if item.get("id") not in invariants:
            continue
        for witness in item.get("witnesses", []):
            t = witness_time_us(witness.get("data", {}))
            if t is not None and (best is None or t < best):
                best = t
    return None if best is None else round(best / 1e6, 3)


# the keys a witness may carry its time in, most telling first: the moment the violation became visible
# (a delivery, a snapshot, a CONNACK: "t"; a lost message: the reconnect that should have brought it)
_TIME_KEYS = ("t", "t_reconnect", "t_delivery", "t_connect", "t_invoke", "t_ack")


def witness_time_us(data: Any) -> float | None:
    if not isinstance(data, Mapping):
        return None
    for key in _TIME_KEYS:
        value = data.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    return None


def _first_witness(report: Mapping[str, Any], invariants: list[str]) -> str:
    for invariant in invariants:
        for item in report.get("invariants", []):
            if item.get("id") == invariant and item.get("witnesses"):
                return f"{invariant}: {item['witnesses'][0].get('text', '')}"[:600]
    return ""


def selftest_exit_code(rows: list[Row], uncovered: tuple[str, ...] = (), errors: list[str] | None = None) -> int:
    """1 if a defect was caught on fewer seeds than its entry needs (even counting every unknown seed as a
    catch) or a correct run had a violation; else 2 if anything is unknown (a defect short of its need only
    through unknown seeds, an undecided correct run, a catalog defect without an entry, an error); else 0.
    Black-box findings never decide it."""
    summaries = defect_summaries(rows)
    correct = [r for r in rows if r.role in ("correct", "false_alarm")]
    if any(s["outcome"] == MISSED for s in summaries) or any(r.outcome == VIOLATION for r in correct):
        return EXIT_FAIL
    if uncovered or errors or any(s["outcome"] == UNKNOWN for s in summaries) or \
            any(r.outcome == UNKNOWN for r in correct) or not (summaries or correct):
        return EXIT_UNKNOWN
    return EXIT_OK


def defect_summaries(rows: list[Row]) -> list[dict[str, Any]]:
    """Per defect and scenario (in row order): the seeds run, how many caught / missed / unknown, the need,
    the outcome (caught: at least ``need`` seeds caught it; missed: not even with every unknown seed;
    unknown otherwise) and the median time to detection over the catching seeds."""
    groups: dict[tuple[str, str], list[Row]] = {}
    for row in rows:
        if row.role == "defect":
            groups.setdefault((str(row.defect), row.scenario), []).append(row)
    summaries = []
    for (defect, scenario), group in groups.items():
        caught = [r for r in group if r.outcome == CAUGHT]
        unknown = sum(r.outcome == UNKNOWN for r in group)
        need = max(r.need for r in group)
        outcome = CAUGHT if len(caught) >= need else MISSED if len(caught) + unknown < need else UNKNOWN
        times = [r.detection_s for r in caught if r.detection_s is not None]
        summaries.append({
            "defect": defect, "scenario": scenario, "expect": list(group[0].expect),
            "seeds": [r.seed for r in group], "caught_seeds": [r.seed for r in caught],
            "caught": len(caught), "missed": sum(r.outcome == MISSED for r in group), "unknown": unknown,
            "runs": len(group), "need": need, "outcome": outcome,
            "median_detection_s": round(statistics.median(times), 2) if times else None})
    return summaries


def false_alarm_figures(rows: list[Row]) -> dict[str, dict[str, int]]:
    """Per scenario: correct-broker runs (matrix correct runs + repeats), runs with a violation, unknown."""
    figures: dict[str, dict[str, int]] = {}
    for row in rows:
        if row.role not in ("correct", "false_alarm"):
            continue
        f = figures.setdefault(row.scenario, {"runs": 0, "violations": 0, "unknown": 0})
        f["runs"] += 1
        f["violations"] += row.outcome == VIOLATION
        f["unknown"] += row.outcome == UNKNOWN
    return figures


def _relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


# ----------------------------------------------------------------------------------------------- running

def run_selftest(matrix: Matrix, tier: str, out: Path, *, repeat: int | None = None, blackbox: bool | None = None,
                 defects: tuple[str, ...] = (), seeds: tuple[int, ...] = (), spark_master: str | None = None,
                 log: Callable[[str], None] = print) -> SelftestResult:
    """Run every job of the tier one after the other, then check all runs in one Spark job, judge, write
    selftest.json + selftest.html under ``out``."""
    from ordeal import pipeline

    started = time.monotonic()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    jobs = plan_jobs(matrix, tier, repeat=repeat, blackbox=blackbox, defects=defects, seeds=seeds)
    result = SelftestResult(tier=tier, uncovered=matrix.uncovered(_catalog()) if not defects else ())
    played: list[tuple[Job, Path | None, float | None, str, str]] = []  # job, run dir, run_s, replay, error
    for number, job in enumerate(jobs, 1):
        scenario_path = job.scenario
        if job.defect:
            scenario_path = out / "scenarios" / f"{job.scenario.stem}+{job.defect}.toml"
            scenario_path.parent.mkdir(parents=True, exist_ok=True)
            scenario_path.write_text(scenario_with_defect(job.scenario.read_text(), job.defect))
        log(f"[{number}/{len(jobs)}] {job.label}: {_relative(job.scenario)} seed {job.seed}")
        mark = time.monotonic()
        try:
            run = pipeline.run(scenario_path, job.seed, out / "runs" / job.label, check=False)
        except KeyboardInterrupt:
            raise
        except Exception as error:  # noqa: BLE001 - one broken run is an unknown row, not a crashed selftest
            played.append((job, None, None, "", f"{type(error).__name__}: {error}"))
            log(f"    could not run: {type(error).__name__}: {error}")
            continue
        run_s = round(time.monotonic() - mark, 2)
        error = "" if run.exit_code == 0 else str(run.summary.get("error") or "the history is incomplete")
        played.append((job, run.run_dir, run_s, run.summary.get("replay", ""), error))
        log(f"    ran in {run_s:.1f} s{'  (' + error + ')' if error else ''}")

    run_dirs = [d for _, d, _, _, _ in played if d is not None]
    reports: dict[Path, dict[str, Any]] = {}
    if run_dirs:
        log(f"checking {len(run_dirs)} run(s) in one Spark job ...")
        mark = time.monotonic()
        try:
            reports = _check_all(run_dirs, spark_master)
        except Exception as error:  # noqa: BLE001 - the checker broke: every row becomes unknown
            result.errors.append(f"the check failed: {type(error).__name__}: {error}")
            log(result.errors[-1])
        result.check_s = round(time.monotonic() - mark, 2)
        log(f"checked in {result.check_s:.1f} s")
    for job, run_dir, run_s, replay, error in played:
        report = reports.get(run_dir) if run_dir is not None else None
        result.rows.append(judge(job, report, run_s=run_s, run_dir=str(run_dir) if run_dir else None,
                                 replay=replay, run_error=error))
    result.rows = discount_shared_failures(result.rows)
    result.total_s = round(time.monotonic() - started, 2)
    write_outputs(result, out, matrix)
    return result


def rejudge(out: Path, matrix: Matrix, *, recheck: bool = False, spark_master: str | None = None,
            log: Callable[[str], None] = print) -> SelftestResult:
    """Judge a finished self-test again from its stored reports (OUT/selftest.json + each run's report.json),
    without running anything: for a changed judging rule or a re-rendered table.  ``recheck``: check the
    stored runs again first (one Spark job), for changed checkers (new invariants, fixed rules)."""
    out = Path(out)
    previous = json.loads((out / "selftest.json").read_text())
    if recheck:
        run_dirs = [Path(r["run_dir"]) for r in previous["rows"] if r["run_dir"] and Path(r["run_dir"]).is_dir()]
        log(f"checking {len(run_dirs)} stored run(s) again in one Spark job ...")
        mark = time.monotonic()
        _check_all(run_dirs, spark_master)
        previous["check_s"] = round(time.monotonic() - mark, 2)
    result = SelftestResult(tier=previous["tier"], uncovered=tuple(previous.get("uncovered", ())),
                            check_s=previous.get("check_s"), total_s=previous.get("total_s"),
                            errors=list(previous.get("errors", [])))
    # A row's expectation comes from the matrix as it is now (an entry may point at a new invariant since the
    # run): the stored expect/need only stand in for a defect the matrix no longer has.
    current = {e.defect: e for e in matrix.entries if e.tier == previous["tier"]}
    for row in previous["rows"]:
        entry = current.get(row["defect"]) if row["role"] == "defect" else None
        if entry is not None and not entry.scenario.as_posix().endswith("/" + row["scenario"].lstrip("/")):
            entry = None  # the entry moved to another scenario: this row answers the old question
        expect = entry.expect if entry else tuple(row["expect"])
        need = min(entry.need, row.get("need", entry.need)) if entry else row.get("need", 1)
        job = Job(row["role"], row["label"], REPO_ROOT / row["scenario"], row["seed"], row["defect"],
                  expect, need)
        report = None
        if row["run_dir"] and (Path(row["run_dir"]) / "report.json").is_file():
            report = read_json(Path(row["run_dir"]) / "report.json")
        result.rows.append(judge(job, report, run_s=row["run_s"], run_dir=row["run_dir"], replay=row["replay"],
                                 run_error=row["reason"] if report is None else ""))
    result.rows = discount_shared_failures(result.rows)
    write_outputs(result, out, matrix)
    return result


def _check_all(run_dirs: list[Path], spark_master: str | None) -> dict[Path, dict[str, Any]]:
    """The pipeline's one check-and-write path: reports written and the check recorded in each summary.json."""
    from ordeal import pipeline

    checked = pipeline.check_and_record(run_dirs, spark_master=spark_master)
    if checked and all(c.report is None for c in checked) and checked[0].failure:
        raise RuntimeError(checked[0].failure)
    return {c.run_dir: c.report for c in checked if c.report is not None}


def _catalog() -> Mapping[str, Any]:
    from reference_broker.defects import CATALOG

    return CATALOG


# ----------------------------------------------------------------------------------------------- output

def result_document(result: SelftestResult, matrix: Matrix) -> dict[str, Any]:
    catalog = _catalog()
    return {
        "tier": result.tier,
        "matrix": matrix.source,
        "exit_code": result.exit_code,
        "verdict": {EXIT_OK: "pass", EXIT_FAIL: "fail", EXIT_UNKNOWN: "unknown"}[result.exit_code],
        "catalog_size": len(catalog),
        "uncovered": list(result.uncovered),
        "check_s": result.check_s,
        "total_s": result.total_s,
        "errors": result.errors,
        "false_alarms": false_alarm_figures(result.rows),
        "defects": [d | {"catalog_invariant": catalog[d["defect"]].invariant if d["defect"] in catalog else None}
                    for d in defect_summaries(result.rows)],
        "rows": [asdict(r) | {"expect": list(r.expect), "failed": list(r.failed), "unknown": list(r.unknown),
                              "catalog_invariant": catalog[r.defect].invariant if r.defect in catalog else None}
                 for r in result.rows],
    }


def write_outputs(result: SelftestResult, out: Path, matrix: Matrix) -> None:
    document = result_document(result, matrix)
    (out / "selftest.json").write_text(json.dumps(document, indent=2, default=str) + "\n")
    (out / "selftest.html").write_text(render_html(document))
    (out / "selftest-junit.xml").write_text(junit_xml(document))
    (out / "selftest.md").write_text(markdown(document))


_SUMMARY_COLUMNS = ("defect", "scenario", "must fail", "caught / seeds", "need", "outcome", "median detect s")


def summary_rows(document: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """One line per defect and scenario: the detection matrix as the README shows it."""
    return [(d["defect"], Path(d["scenario"]).stem, ", ".join(d["expect"]), f"{d['caught']}/{d['runs']}",
             str(d["need"]), d["outcome"], "-" if d["median_detection_s"] is None else f"{d['median_detection_s']:.2f}")
            for d in document.get("defects", [])]


def markdown(document: Mapping[str, Any]) -> str:
    """The matrix as Markdown tables: per defect, then per run (docs/selftest.md is generated from it)."""
    lines = []
    if document.get("defects"):
        lines += ["| " + " | ".join(_SUMMARY_COLUMNS) + " |", "|" + "---|" * len(_SUMMARY_COLUMNS)]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |" for cells in summary_rows(document)]
        lines.append("")
    lines += ["| " + " | ".join(_COLUMNS) + " |", "|" + "---|" * len(_COLUMNS)]
    for cells in table_rows(document):
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    lines.append("")
    lines.append("| scenario (correct broker) | runs | with a violation | unknown |")
    lines.append("|---|---|---|---|")
    for scenario, f in document["false_alarms"].items():
        lines.append(f"| {scenario} | {f['runs']} | {f['violations']} | {f['unknown']} |")
    lines.append("")
    lines.append(f"Tier {document['tier']}, verdict **{document['verdict']}** (exit {document['exit_code']}); "
                 f"check {document['check_s']} s for all runs in one Spark job; total {document['total_s']} s.")
    return "\n".join(lines) + "\n"


def junit_xml(document: Mapping[str, Any]) -> str:
    """One test case per judged run (CI): missed / violation -> <failure>, unknown -> <error>, black-box
    findings -> a passing case whose system-out lists what failed.  Written by the one JUnit writer."""
    from spark_checkers.junit import Case
    from spark_checkers.junit import junit_xml as write_junit

    cases = []
    for r in document["rows"]:
        classname, name, time_s = f"selftest.{r['role']}", r["label"], r["run_s"] or 0
        text = r["witness"] or r["reason"] or ""
        if r["outcome"] == MISSED:
            cases.append(Case(classname, name, "failure", f"defect {r['defect']} not caught by "
                              f"{', '.join(r['expect'])}; failed: {', '.join(r['failed']) or 'nothing'}", text, time_s))
        elif r["outcome"] == VIOLATION:
            cases.append(Case(classname, name, "failure", f"correct broker violated {', '.join(r['failed'])}",
                              text, time_s))
        elif r["outcome"] == UNKNOWN:
            cases.append(Case(classname, name, "error", "unknown", text, time_s))
        elif r["outcome"] == FINDING:
            cases.append(Case(classname, name, text=f"failed: {', '.join(r['failed']) or 'nothing'}\n{text}",
                              time_s=time_s))
        else:
            cases.append(Case(classname, name, time_s=time_s))
    for uncovered in document.get("uncovered", []):
        cases.append(Case("selftest.defect", f"defect-{uncovered}", "error", "no matrix entry for this catalog defect"))
    return write_junit(f"ordeal.selftest.{document['tier']}", cases, document.get("total_s") or 0)


_COLUMNS = ("role", "defect", "scenario", "seed", "expected", "outcome", "failed", "detect s", "run s")


def table_rows(document: Mapping[str, Any]) -> list[tuple[str, ...]]:
    rows = []
    for r in document["rows"]:
        rows.append((r["role"], r["defect"] or "-", Path(r["scenario"]).stem, str(r["seed"]),
                     ", ".join(r["expect"]) or "-", r["outcome"], ", ".join(r["failed"]) or "-",
                     "-" if r["detection_s"] is None else f"{r['detection_s']:.2f}",
                     "-" if r["run_s"] is None else f"{r['run_s']:.1f}"))
    return rows


def _aligned(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    rows = [header, *rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def text_table(document: Mapping[str, Any]) -> str:
    lines = _aligned(_COLUMNS, table_rows(document))
    if document.get("defects"):
        lines += ["", *_aligned(_SUMMARY_COLUMNS, summary_rows(document))]
    figures = document["false_alarms"]
    runs = sum(f["runs"] for f in figures.values())
    bad = sum(f["violations"] for f in figures.values())
    lines.append("")
    lines.append(f"correct-broker runs: {runs}, with a violation: {bad}; check {document['check_s']} s, "
                 f"total {document['total_s']} s")
    if document["uncovered"]:
        lines.append(f"catalog defects without a matrix entry: {', '.join(document['uncovered'])}")
    for error in document["errors"]:
        lines.append(f"error: {error}")
    lines.append(f"selftest verdict: {document['verdict']} (exit {document['exit_code']})")
    return "\n".join(lines)


_OUTCOME_COLOURS = {CAUGHT: "#d4f7d4", PASSED: "#d4f7d4", MISSED: "#f7d4d4", VIOLATION: "#f7d4d4",
                    UNKNOWN: "#f7ecc4", FINDING: "#dde6f7"}


def render_html(document: Mapping[str, Any]) -> str:
    """One self-contained page: the table, each row's first witness, the false-alarm figures."""
    esc = html.escape
    body = []
    for r, cells in zip(document["rows"], table_rows(document), strict=True):
        colour = _OUTCOME_COLOURS.get(r["outcome"], "#fff")
        tds = "".join(f"<td>{esc(c)}</td>" for c in cells)
        detail = esc(r["witness"] or r["reason"] or "")
        link = f'<a href="{esc(_href(r["run_dir"]))}">report</a>' if r["run_dir"] else ""
        body.append(f'<tr style="background:{colour}">{tds}<td>{link}</td><td class="w">{detail}</td></tr>')
    head = "".join(f"<th>{esc(c)}</th>" for c in (*_COLUMNS, "run", "first witness / reason"))
    figures = "".join(f"<tr><td>{esc(s)}</td><td>{f['runs']}</td><td>{f['violations']}</td><td>{f['unknown']}</td></tr>"
                      for s, f in document["false_alarms"].items())
    uncovered = ", ".join(document["uncovered"]) or "none"
    summary_head = "".join(f"<th>{esc(c)}</th>" for c in _SUMMARY_COLUMNS)
    summary = "".join(
        f'<tr class="defect" style="background:{_OUTCOME_COLOURS.get(d["outcome"], "#fff")}">'
        + "".join(f"<td>{esc(c)}</td>" for c in cells) + "</tr>"
        for d, cells in zip(document.get("defects", []), summary_rows(document), strict=True))
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>ordeal selftest ({esc(document['tier'])})</title>
<style>body{{font-family:sans-serif;margin:1.5em}}table{{border-collapse:collapse;margin-bottom:1.5em}}
td,th{{border:1px solid #bbb;padding:3px 6px;font-size:13px;vertical-align:top}}td.w{{max-width:40em}}</style>
</head><body>
<h1>ordeal selftest: {esc(document['verdict'])} (tier {esc(document['tier'])}, exit {document['exit_code']})</h1>
<p>Matrix {esc(document['matrix'])}; catalog defects {document['catalog_size']}; without an entry: {esc(uncovered)};
check {document['check_s']} s; total {document['total_s']} s.
<i>detect s</i>: run start to the first witness of the expected invariant.</p>
<h2>Per defect: the seeds that caught it</h2>
<table><tr>{summary_head}</tr>{summary}</table>
<h2>Per run</h2>
<table><tr>{head}</tr>{''.join(body)}</table>
<h2>Correct-broker runs (false alarms)</h2>
<table><tr><th>scenario</th><th>runs</th><th>with a violation</th><th>unknown</th></tr>{figures}</table>
{''.join(f'<p>error: {esc(e)}</p>' for e in document['errors'])}
</body></html>
"""


def _href(run_dir: str) -> str:
    return str(Path(run_dir).resolve() / "report.html")
