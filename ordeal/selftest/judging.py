"""Judging the self-test's runs: one run's outcome against its expectation (``judge``), a catch the
correct broker shares discounted, the per-defect summaries over their seeds, the false-alarm figures and
the self-test's exit code."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from contracts.exit_codes import EXIT_FAIL, EXIT_PASS, EXIT_UNKNOWN
from ordeal.selftest.matrix import relative_to_repo
from ordeal.selftest.tier import Job

# outcome of one judged run
CAUGHT, MISSED, PASSED, VIOLATION, UNKNOWN, FINDING = "caught", "missed", "pass", "violation", "unknown", "finding"


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
    shard: dict[str, Any] | None = None  # ordeal/shard.py shard_record (K, N, the whole plan's labels); merged: merge's

    @property
    def exit_code(self) -> int:
        return selftest_exit_code(self.rows, self.uncovered if self.tier == "full" else (), self.errors)


def judge(job: Job, report: Mapping[str, Any] | None, *, run_s: float | None, run_dir: str | None,
          replay: str = "", run_error: str = "") -> Row:
    """Decide one run.  defect: caught when every expected invariant failed; missed when one passed (or
    was not applicable); unknown otherwise.  correct / false_alarm: pass only when the run passed; any
    failure is a violation.  blackbox: always a finding (what failed is listed)."""
    base = dict(role=job.role, label=job.label, scenario=relative_to_repo(job.scenario), seed=job.seed,
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
    return EXIT_PASS


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
