"""check_run / check_runs: open stored runs, run every checker in one Spark job, decide, write reports."""

from __future__ import annotations

import json
import platform
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contracts.history_schema import SCHEMA_VERSION
from contracts.invariants import INVARIANTS
from contracts.versions import REPORT_VERSION
from spark_checkers import CHECKER_VERSION, context
from spark_checkers.build import build
from spark_checkers.collect import WITNESS_CAP, collect_all, collect_context, collect_violations
from spark_checkers.defaults import WARM_UP_BIG_EVENTS, WARM_UP_BIG_ROUNDS, WARM_UP_MIN_EVENTS
from spark_checkers.engine.spark_session import SparkUnavailable, choose, describe, spark_session
from spark_checkers.job import sizing
from spark_checkers.job.codes import CODED, Names, code_of, lookup_names
from spark_checkers.job.columns import UNREAD_COLUMNS
from spark_checkers.job.events import RunSpec, collect_small, collect_topics, load_events, without_wills
from spark_checkers.job.metrics import WINDOW_LOST, WINDOW_OWED, window_key
from spark_checkers.job.metrics import metric_rows as summed_metric_rows
from spark_checkers.job.timing import timed
from spark_checkers.loader import RunInput, local_run_dir, open_run
from spark_checkers.rules.catalog import explain
from spark_checkers.rules.logs import LOG_INVARIANTS, LogFinding, judge_logs
from spark_checkers.rules.losses import EXPIRED_BY_CLOCK, LOSS_INVARIANTS, loss_gaps
from spark_checkers.timeline import Timeline, build_timeline, has_mqtt5
from spark_checkers.verdicts import NOT_APPLICABLE, VERDICTS, InvariantResult, decide, exit_code


@dataclass
class RunOutcome:
    """What the Spark side and the timeline found for one run, before any verdict."""

    counts: dict[str, int] = field(default_factory=dict)
    witnesses: dict[str, list[dict]] = field(default_factory=dict)
    metrics: list[tuple[str, str, float]] = field(default_factory=list)
    timeline: Timeline | None = None
    errors: dict[str, str] = field(default_factory=dict)  # invariant -> checker error
    fatal: list[str] = field(default_factory=list)
    # invariant -> the context rows of each shown witness, in the order they are shown (spark_checkers/context.py)
    contexts: dict[str, list[list[dict]]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def check_run(run_dir: str | Path, spark_master: str | None = None, *, spark=None, quiet: bool = False,
              spark_remote: str | None = None) -> int:
    """Check one stored run, write report.json / junit.xml / report.html into it, return 0 / 1 / 2."""
    run_dir = local_run_dir(run_dir)
    report = check_runs([run_dir], spark_master=spark_master, spark=spark, spark_remote=spark_remote)[0]
    from spark_checkers.reports import write_reports

    write_reports(run_dir, report)
    if not quiet:
        from spark_checkers.reports import print_table

        print_table(report)
    return report["exit_code"]


def check_runs(run_dirs: list[Path | str], *, spark_master: str | None = None, spark=None,
               spark_remote: str | None = None, plan: str | None = None) -> list[dict[str, Any]]:
    """Check many stored runs in one Spark job; one report dict (the report.json content) per run.  Never
    raises for a checker failure (Spark cannot start or be reached, a job dies): those runs are unknown, with
    the reason.  The session: ``spark``, else engine.spark_session.spark_session(spark_master, spark_remote).
    ``plan`` ("small" or "big", job/sizing.py: PLANS) forces the plan's shape, which by default follows the histories'
    size: the warm-up (``warm_up``) compiles a big check's code on a history that is not big."""
    started = time.monotonic()
    if plan is not None and plan not in sizing.PLANS:
        raise ValueError(f"plan={plan!r}: expected one of {', '.join(sizing.PLANS)} or None (by the histories' size)")

    with timed("open runs"):
        inputs = [open_run(d, run_id=f"run{i}") for i, d in enumerate(run_dirs)]
    outcomes: dict[str, RunOutcome] = {i.run_id: RunOutcome(fatal=list(i.fatal)) for i in inputs}
    readable = [i for i in inputs if i.readable]
    master = spark_remote or spark_master
    if readable:
        try:
            spark = spark or spark_session(spark_master, remote=spark_remote)
            master = describe(spark)
        except Exception as error:  # noqa: BLE001 - no Spark, no verdict: unknown, never a crash or a pass
            try:
                where = choose(spark_master, spark_remote).describe()
            except ValueError as bad:
                where = str(bad)
            text = (f"no Spark to check with: {error}" if isinstance(error, SparkUnavailable)
                    else f"Spark did not start ({where}): {_short(error)}")
            for run in readable:
                outcomes[run.run_id].fatal.append(f"checker error: {text}")
            readable = []
    if readable:
        _evaluate_isolating(spark, readable, outcomes, plan)
    elapsed = time.monotonic() - started
    return [_report(i, outcomes[i.run_id], master, elapsed) for i in inputs]


def _evaluate_isolating(spark, inputs: list[RunInput], outcomes: dict[str, RunOutcome], plan: str | None) -> None:
    """Evaluate together; if the batch breaks, evaluate run by run so one bad history spoils only itself."""
    try:
        _evaluate(spark, inputs, outcomes, plan)
        return
    except Exception as error:  # noqa: BLE001 - a checker error must become an unknown verdict, never a crash
        if len(inputs) == 1:
            run = inputs[0]
            outcomes[run.run_id] = RunOutcome(fatal=[f"checker error: {_short(error)}"])
            outcomes[run.run_id].errors["*"] = traceback.format_exc(limit=3)
            return
    for run in inputs:
        outcomes[run.run_id] = RunOutcome(fatal=list(run.fatal))
        _evaluate_isolating(spark, [run], outcomes, plan)


def _release(cached: list) -> None:
    """Unpersist what the check materialised; a dead JVM cannot, and must not hide the first error."""
    for df in cached:
        try:
            df.unpersist()
            # A classic local checkpoint's blocks belong to its RDD, not to a cache entry (on Connect the
            # server drops it when the client's DataFrame goes).
            plan = df._jdf.logicalPlan() if hasattr(df, "_jdf") else None
            if plan is not None and plan.getClass().getSimpleName() == "LogicalRDD":
                plan.rdd().unpersist(False)
        except Exception:  # noqa: BLE001, S110 - best effort: the verdict is already decided elsewhere
            pass


def _short(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:500]


def _evaluate(spark, inputs: list[RunInput], outcomes: dict[str, RunOutcome], plan: str | None) -> None:
    specs = [RunSpec(i.run_id, i.parts, i.guarantees) for i in inputs]
    total_bytes = sizing.plan_bytes(sum(Path(p).stat().st_size for i in inputs for p in i.parts if "://" not in p),
                                  plan)
    for key, value in sizing.session_settings(total_bytes).items():
        spark.conf.set(key, value)
    cached: list = []
    try:
        # Not cached: measured, building an in-memory columnar copy of every event cost more than the three
        # extra Parquet scans it saved (each scan reads only the columns its step needs).
        events = load_events(spark, specs).drop(*UNREAD_COLUMNS)
        timelines: dict[str, Timeline] = {}
        names: list[Names] = []  # prepare()'s

        def prepare():  # while the publishes are materialised (build.py)
            # Two scans of the history side by side, too: each job's idle moments are the other's.
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ordeal-check-small") as aside:
                collecting = aside.submit(collect_small, events)
                with timed("scan + topics"):
                    topics, rows_read, nodes = collect_topics(events)
                with timed("small rows"):
                    small = collecting.result()
            for run in inputs:
                if rows_read.get(run.run_id, 0) != run.rows:
                    raise RuntimeError(f"{run.run_dir}: read {rows_read.get(run.run_id, 0)} rows from the history "
                                       f"parts, their footers say {run.rows}")
            with timed("timelines"):
                timelines.update({i.run_id: build_timeline(i.run_id, small.get(i.run_id, []), i.guarantees)
                                  for i in inputs})
            # The names the witnesses will carry coded (job/codes.py: CODED): every client of the small rows, the
            # published topics, the nodes; any other (a phantom's publisher, a body hash) is looked up later.
            known = {row.get(c) for rows in small.values() for row in rows for c in CODED} | nodes
            known.update(t for run_topics in topics.values() for t in run_topics)
            names.append(Names.of(sorted(n for n in known if n is not None)))
            return timelines, topics

        # Leaving the executor waits for its thread: whatever it materialised is in ``cached`` before the
        # ``finally`` releases it, and a big check's early collect (Checks.early) is done.
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ordeal-check") as aside:
            checks = build(spark, specs, without_wills(events), prepare, cached, small=total_bytes < sizing.SMALL_BYTES,
                                aside=aside)
            try:
                with timed("violations + metrics"):
                    counts, witnesses, metric_rows = collect_all(checks.violations, checks.metrics)
                    if checks.early is not None:
                        early_counts, early_witnesses, early_metrics = checks.early.result()
                        counts.update(early_counts)
                        witnesses.update(early_witnesses)
                        metric_rows += early_metrics
            except Exception as error:  # noqa: BLE001
                counts, witnesses, metric_rows = {}, {}, None
                # Why one by one: find which checker broke, keep the others' answers.
                for invariants, part in checks.parts():
                    try:
                        c, w = collect_violations(part)
                        counts.update(c)
                        witnesses.update(w)
                    except Exception as part_error:  # noqa: BLE001 - named without running it again (it broke)
                        for run in inputs:
                            for invariant in invariants:
                                outcomes[run.run_id].errors[invariant] = _short(part_error)
                if not any(o.errors for o in outcomes.values()):
                    raise error
            if metric_rows is None:
                with timed("metrics"):
                    metric_rows = summed_metric_rows(checks.all_metrics().collect())
    finally:
        _release(cached)
    decoded = {key: [json.loads(w) for w in found] for key, found in witnesses.items()}
    unknown = names[0].unknown([*decoded.values(), *[row["key"] for row in metric_rows]])
    if unknown:
        try:
            with timed("names of codes"):
                names[0].learn(lookup_names(events, unknown))
        except Exception as error:  # noqa: BLE001 - the verdicts stand; those values show as "<code N>"
            for run in inputs:
                outcomes[run.run_id].notes.append(
                    f"{len(unknown)} names in the witnesses could not be read back from the history: {_short(error)}")
    for run in inputs:
        outcome = outcomes[run.run_id]
        outcome.timeline = timelines[run.run_id]
        for (run_id, invariant), count in counts.items():
            if run_id == run.run_id:
                outcome.counts[invariant] = count
                outcome.witnesses[invariant] = names[0].decode(decoded[(run_id, invariant)])
    for row in metric_rows:
        outcomes[row["run_id"]].metrics.append((row["metric"], names[0].decode(row["key"]), row["value"]))
    try:
        with timed("witness context"):
            _contexts(spark, events, inputs, outcomes)
    except Exception as error:  # noqa: BLE001 - the context only illustrates the witnesses; verdicts stand
        for run in inputs:
            outcomes[run.run_id].notes.append(f"the witnesses' history context could not be read: {_short(error)}")


def _merged(outcome: RunOutcome) -> tuple[dict[str, int], dict[str, list[dict]], dict[str, dict[str, float]]]:
    """(counts, witnesses, metrics) of one run: the Spark side's, the timeline's and the stored-id check's."""
    counts = dict(outcome.counts)
    witnesses = {k: list(v) for k, v in outcome.witnesses.items()}
    metrics: dict[str, dict[str, float]] = {}
    for metric, key, value in outcome.metrics:
        metrics.setdefault(metric, {})[key] = value
    timeline = outcome.timeline
    if timeline is not None:
        for invariant, found in timeline.violations.items():
            counts[invariant] = counts.get(invariant, 0) + len(found)
            witnesses.setdefault(invariant, []).extend(found)
        _last_packet_id(timeline, metrics.get("last_packet_id", {}), counts, witnesses)
        _session_windows(witnesses, metrics)
    return counts, witnesses, metrics


SESSION_INVARIANTS = ("durability.session_lost", "durability.session_lost_allowed", "durability.session_returned")


def _session_windows(witnesses: dict[str, list[dict]], metrics: dict[str, dict[str, float]]) -> None:
    """Each lost or returned session's witness with the acknowledged messages its offline window owed
    (``acked_owed``) and how many of them were never delivered (``acked_lost``, by cause): the reconnect that
    ends the window is ``window_c`` (the loss itself, or the reconnect where the session came back)."""
    owed, lost = metrics.get(WINDOW_OWED, {}), metrics.get(WINDOW_LOST, {})
    for invariant in SESSION_INVARIANTS:
        for w in witnesses.get(invariant, []):
            if w.get("window_c") is None or w.get("client") is None:
                continue
            key = window_key(code_of(w["client"]), w["window_c"])
            by_cause = {k.rsplit("|", 1)[1]: int(v) for k, v in lost.items() if k.rsplit("|", 1)[0] == key}
            w["acked_owed"], w["acked_lost"] = int(owed.get(key, 0)), sum(by_cause.values())
            w["lost_by_cause"] = by_cause


def _covers(invariant: str, witnesses: list[dict], metrics: dict[str, dict[str, float]],
            timeline: Timeline | None) -> dict[str, int]:
    """What a durability verdict judged, in acknowledged messages (report.json "covers")."""
    totals = metrics.get("count", {})
    if invariant in LOSS_INVARIANTS:
        return {"acknowledged": int(totals.get("acked", 0)), "owed": int(totals.get("owed", 0))}
    if invariant in SESSION_INVARIANTS:
        windows = {(w.get("client"), w.get("window_c")): w for w in witnesses if w.get("window_c") is not None}
        covers = {"sessions": len(witnesses),
                  "acknowledged_owed": sum(w.get("acked_owed", 0) for w in windows.values()),
                  "acknowledged_lost": sum(w.get("acked_lost", 0) for w in windows.values())}
        if invariant == "durability.session_lost" and timeline is not None:
            covers["resumes_judged"] = sum(1 for rows in timeline.connects.values() for r in rows
                                           if r.get("clean_start") is False)
        return covers
    if invariant.startswith("durability."):
        return {"delivered_messages": int(totals.get("delivered_messages", 0)),
                "acknowledged": int(totals.get("acked", 0))}
    return {}


def _contexts(spark, events, inputs: list[RunInput], outcomes: dict[str, RunOutcome]) -> None:
    """The history rows around every witness the report will show (one Spark query for all runs)."""
    windows, where = [], {}
    for run in inputs:
        outcome = outcomes[run.run_id]
        if outcome.timeline is None:
            continue
        counts, witnesses, _ = _merged(outcome)
        for invariant, raw in witnesses.items():
            shown, _details = _shown(invariant, raw, outcome.timeline, counts.get(invariant, 0))
            for index, w in enumerate(shown):
                window = context.window_of(w)
                if window is None:
                    continue
                wid = len(windows)
                windows.append((run.run_id, wid, window.client, window.t_lo, window.t_hi, window.publisher,
                                window.pub_seq))
                where[wid] = (run.run_id, invariant, index, window)
    found = collect_context(spark, events, windows, context.MESSAGE_ROWS, context.MARGIN_US)
    for wid, (run_id, invariant, index, window) in where.items():
        outcome = outcomes[run_id]
        rows = context.assemble(window, found.get((run_id, wid), []), outcome.timeline)
        per = outcome.contexts.setdefault(invariant, [])
        per.extend([[] for _ in range(index + 1 - len(per))])
        per[index] = rows


def _report(run: RunInput, outcome: RunOutcome, master: str | None, elapsed: float) -> dict[str, Any]:
    timeline = outcome.timeline
    g = run.guarantees
    counts, witnesses, metrics = _merged(outcome)
    unknown: dict[str, str] = {}
    incomplete = list(run.incomplete)
    if timeline is not None:
        incomplete += timeline.incomplete
        unknown.update(timeline.unknown)
    errors = dict(outcome.errors)
    if errors:
        unknown.update({k: f"checker error: {v}" for k, v in errors.items() if k != "*"})
    fatal = tuple(outcome.fatal)
    logs = _log_findings(run, g, timeline, fatal)
    errors.update({k: f.unknown.removeprefix("checker error: ") for k, f in logs.items()
                   if f.unknown and f.unknown.startswith("checker error: ")})  # named by meta.checker_error
    results = []
    for invariant in INVARIANTS:
        if invariant.id in logs:
            results.append(_log_result(invariant, logs[invariant.id], g, fatal))
            continue
        count = counts.get(invariant.id, 0)
        reason = unknown.get(invariant.id)
        if invariant.id == "meta.history_complete" and incomplete:
            reason = "; ".join(incomplete)
        if invariant.id == "meta.checker_error" and errors:
            reason = "; ".join(f"{k}: {v}" for k, v in errors.items())
        verdict, why, allowed = decide(invariant, count, allowed=g.allowed if g else (), fatal=fatal,
                                       incomplete=tuple(incomplete), unknown_reason=reason,
                                       white_box=g.white_box if g else True,
                                       queue_policy=g.queue_policy if g else "drop_oldest",
                                       allowance=_allowance(g), history_version=_history_version(run),
                                       mqtt5=timeline is None or has_mqtt5(timeline))
        if timeline is not None and invariant.id in timeline.inapplicable and not fatal:
            verdict, why, allowed = NOT_APPLICABLE, timeline.inapplicable[invariant.id], False
        shown, details = _witnesses(invariant.id, witnesses.get(invariant.id, []), timeline, count,
                                    outcome.contexts.get(invariant.id, []))
        if invariant.id == "expiry.dropped_early" and witnesses.get(EXPIRED_BY_CLOCK) and timeline is not None:
            # What the clock explains beside the losses (rules/losses.py EXPIRED_BY_CLOCK): reported, never counted.
            details["expired_by_clock"] = {
                "count": counts.get(EXPIRED_BY_CLOCK, 0),
                "shown": [{"text": explain(EXPIRED_BY_CLOCK, w, timeline), "data": w}
                          for w in witnesses[EXPIRED_BY_CLOCK][:WITNESS_CAP]]}
        if invariant.id == "liveness.unseen_over_time":
            count = int(sum(metrics.get("unseen_delta_per_bucket", {}).values()))
            details["owed"] = metrics.get("count", {}).get("owed", 0)
        covers = _covers(invariant.id, witnesses.get(invariant.id, []), metrics, timeline)
        if timeline is not None and invariant.id.startswith("will.") and "will" in timeline.judged:
            covers = {**covers, **timeline.judged["will"]}  # connections with a Will, Wills owed, forbidden, arrived
        if timeline is not None and invariant.id.startswith("retained.") and "retained" in timeline.judged:
            covers = {**covers, **timeline.judged["retained"]}
        if timeline is not None and invariant.id.startswith("shared.") and "shared" in timeline.judged:
            covers = {**covers, **timeline.judged["shared"]}  # the shared groups and their members
        if invariant.id in SESSION_INVARIANTS and covers.get("sessions"):
            details["acknowledged_lost_with_sessions"] = covers["acknowledged_lost"]
        results.append(InvariantResult(invariant.id, invariant.title, verdict, count, tuple(shown), why, allowed,
                                       invariant.reported_only, details, covers))
    code = exit_code(results)
    return {
        "schema_version": REPORT_VERSION,
        "checker_version": CHECKER_VERSION,
        "run_dir": str(run.run_dir),
        "verdict": {0: "pass", 1: "fail", 2: "unknown"}[code],
        "exit_code": code,
        "summary": {v: sum(1 for r in results if r.verdict == v) for v in VERDICTS},
        "notes": _notes(g, timeline) + outcome.notes,
        # The command that reproduces the run, as the run recorded it (report.html opens with it).
        "replay": None if timeline is None else (timeline.phases.get("run_start") or {}).get("replay"),
        "invariants": [r.to_dict() for r in results],
        "history": {"hash_sha256": run.history_hash, "manifest": run.manifest, "parts": len(run.parts),
                    "incomplete": incomplete, "fatal": list(fatal)},
        "guarantees": g.to_dict() if g else None,
        "counts": {k: int(v) for k, v in metrics.get("count", {}).items()},
        "series": _series(metrics, timeline),
        "faults": [] if timeline is None else [
            {"fault_id": f.fault_id, "kind": f.kind, "node": f.node, "t_start_s": (f.t_start - timeline.t_first) / 1e6,
             "t_heal_s": None if f.t_heal is None else (f.t_heal - timeline.t_first) / 1e6, "bit": f.bit,
             "error": f.error} for f in timeline.faults],
        "environment": {"python": sys.version.split()[0], "platform": platform.platform(),
                        "spark_master": master, "pyspark": _pyspark_version(), "check_seconds": round(elapsed, 2)},
    }


def _history_version(run: RunInput) -> int:
    version = (run.manifest or {}).get("schema_version")
    return version if isinstance(version, int) else SCHEMA_VERSION


def _log_findings(run: RunInput, g, timeline: Timeline | None, fatal: tuple[str, ...]) -> dict[str, LogFinding]:
    """The log oracle (spark_checkers/rules/logs.py) over history/logs.parquet; a broken table or a bug in it makes
    only the log invariants unknown."""
    if fatal or g is None:
        return {invariant: LogFinding() for invariant in LOG_INVARIANTS}
    try:
        return judge_logs(run.run_dir / "history", g.log_patterns, timeline.t_first if timeline else 0)
    except Exception as error:  # noqa: BLE001 - a checker error is unknown, never a pass
        return {invariant: LogFinding(unknown=f"checker error: {_short(error)}") for invariant in LOG_INVARIANTS}


def _log_result(invariant, finding: LogFinding, g, fatal: tuple[str, ...]) -> InvariantResult:
    if finding.not_applicable and not fatal:
        verdict, why, allowed = NOT_APPLICABLE, finding.not_applicable, False
    else:
        verdict, why, allowed = decide(invariant, finding.count, allowed=g.allowed if g else (), fatal=fatal,
                                       incomplete=(), unknown_reason=finding.unknown, white_box=True)
        unread = finding.details.get("unread")
        if unread and verdict != "unknown":  # a failure proven by the logs that could be read
            why = f"{why + '; ' if why else ''}not judged: {'; '.join(unread)}"
    return InvariantResult(invariant.id, invariant.title, verdict, finding.count, tuple(finding.witnesses), why,
                           allowed, invariant.reported_only, finding.details)


def _allowance(g) -> str:
    """Why the target never promised to prevent a loss to these faults: its declaration, in words."""
    if g is None or not g.unpromised_faults:
        return ""
    survive = {"kill": "a kill, not a power loss", "graceful": "only a graceful stop"}.get(g.persistence, "no stop")
    return (f"lost to {' / '.join(g.unpromised_faults)} of the target, which declares persistence = "
            f"{g.persistence!r} (acknowledged messages survive {survive})")


def _notes(g, timeline: Timeline | None) -> list[str]:
    """What the reader must know to read the verdicts right (a fault mix that produced no fault)."""
    notes = []
    if g is not None and g.fault_mix and timeline is not None and not timeline.faults:
        notes.append(f"the scenario's fault mix ({', '.join(g.fault_mix)}) produced no fault in this run: "
                     "nothing here was tested under faults")
    return notes


def _pyspark_version() -> str | None:
    try:
        import pyspark

        return pyspark.__version__
    except ImportError:  # pragma: no cover
        return None


def _last_packet_id(timeline: Timeline, delivered: dict[str, float], counts: dict, witnesses: dict) -> None:
    """White box: the stored last packet id must not be behind the last one delivered (mod the wrap)."""
    for snap in timeline.snapshots:
        client, stored = snap.get("client"), snap.get("last_packet_id")
        if client not in delivered or stored is None:
            continue
        last = int(delivered[client])
        behind = (last - stored) % 65535
        if 0 < behind < 32768:
            counts["whitebox.last_packet_id_behind"] = counts.get("whitebox.last_packet_id_behind", 0) + 1
            witnesses.setdefault("whitebox.last_packet_id_behind", []).append(
                {"client": client, "stored": stored, "delivered": last, "t": snap["t_mono_us"]})


def _witnesses(invariant: str, raw: list[dict], timeline: Timeline | None, count: int,
               contexts: list[list[dict]] = ()) -> tuple[list[dict], dict]:
    shown, details = _shown(invariant, raw, timeline, count)
    if timeline is None:
        return [], details
    return [{"text": explain(invariant, w, timeline), "data": w,
             "context": contexts[i] if i < len(contexts) else []} for i, w in enumerate(shown)], details


def _shown(invariant: str, raw: list[dict], timeline: Timeline | None, count: int) -> tuple[list[dict], dict]:
    """The raw witnesses the report shows (the earliest few; lost messages grouped into gaps), and details."""
    if timeline is None or not raw:
        return [], {}
    details: dict[str, Any] = {}
    if invariant in LOSS_INVARIANTS:
        gaps = loss_gaps(raw, timeline, total=count)
        details["gaps_from_first_lost"] = len(raw)
        details["positions"] = {}
        for gap in gaps:
            details["positions"][gap["position"]] = details["positions"].get(gap["position"], 0) + gap["count"]
        raw = gaps
    raw = sorted(raw, key=lambda w: (w.get("t") or w.get("t_invoke") or 0))[:WITNESS_CAP] \
        if invariant not in LOSS_INVARIANTS else raw[:WITNESS_CAP]
    return raw, details


def _series(metrics: dict[str, dict[str, float]], timeline: Timeline | None) -> dict[str, Any]:
    if timeline is None:
        return {}
    bucket_s = timeline.bucket_us / 1e6

    def series(name: str) -> list[list[float]]:
        return sorted([[int(k) * bucket_s, v] for k, v in metrics.get(name, {}).items()])

    unseen, running = [], 0.0
    for t, delta in series("unseen_delta_per_bucket"):
        running += delta
        unseen.append([t, running])
    return {"bucket_s": bucket_s, "acked_per_s": [[t, v / bucket_s] for t, v in series("acked_per_bucket")],
            "delivered_per_s": [[t, v / bucket_s] for t, v in series("delivered_per_bucket")],
            "latency_p50_ms": series("latency_p50_ms"), "latency_p99_ms": series("latency_p99_ms"),
            "owed_unseen": unseen}


def findings(report: dict) -> dict[str, int]:
    """What a report found, to compare with what a synthetic history plants: each failed invariant's count, and
    under "unknown" how many invariants could not be decided (so an undecided check never equals a plant)."""
    found = {i["id"]: i["count"] for i in report["invariants"] if i["verdict"] == "fail"}
    undecided = sum(i["verdict"] == "unknown" for i in report["invariants"])
    return {**found, "unknown": undecided} if undecided else found


@dataclass(frozen=True)
class WarmUpCheck:
    """One warm-up check: its plan shape, size, time, and what it found against what was planted."""

    plan: str
    events: int
    seconds: float
    planted: dict[str, int]
    found: dict[str, int]  # failed invariants' counts, and "unknown": how many could not be decided
    why_unknown: str = ""  # the first undecided invariant's reason

    @property
    def right(self) -> bool:
        return self.found == self.planted


def warm_up(spark, work_dir: str | Path | None = None, big_events: int = WARM_UP_BIG_EVENTS,
            big_rounds: int = WARM_UP_BIG_ROUNDS) -> list[WarmUpCheck]:
    """Check two synthetic histories, one with each plan shape, so that the first real check of either shape
    on this Spark finds its generated code compiled (Spark's code cache) and hot in the JVM's JIT.

    Why it pays: a check's plan generates a few hundred classes, and a big history's plan (adaptive execution,
    more partitions, uncompressed caches) generates others than a run's.  A JVM's first check of a shape compiles
    them (Janino) and then runs them interpreted until the JIT has compiled their hot loops: about 30 CPU-s of
    JIT in a first 10 M check, against 8 in a later one.  The code depends on the plan, not on the row count,
    so a 1 M history checked with the big plan compiles most of it.  The big history is checked ``big_rounds``
    times (one WarmUpCheck each).  Why more than once: the first check compiles the code, but much of the code
    a check runs once per query, not per row (analysis, optimisation, planning, Janino's lookups in the code
    cache, task serialisation), is still lukewarm after one check and reaches the JIT's last tier only in the
    real check that follows: repeated, its JIT work is done here.  The histories are written to a temporary
    directory under ``work_dir`` (default: the system's), which the Spark must read at the same path (a local
    server, not a cluster), and removed afterwards."""
    import tempfile

    from spark_checkers import bulk_history
    from spark_checkers import synthetic as s

    if big_rounds < 1:
        raise ValueError(f"warm_up(big_rounds={big_rounds!r}): expected at least 1 check of the big history")
    if big_events < WARM_UP_MIN_EVENTS:
        raise ValueError(f"warm_up(big_events={big_events!r}): expected at least {WARM_UP_MIN_EVENTS:,} events, "
                         "enough to plant the lost and reordered messages it checks for")
    checks = []
    with tempfile.TemporaryDirectory(prefix="ordeal-warm-up-", dir=work_dir) as tmp:
        spec = s.Spec(pairs=2, messages=24, offline=(s.Offline(0, 5, 9),),
                      faults=(s.Fault("f1", "kill", "redis-7003", 4, 6),), scenario_name="warm-up")
        rows = s.swap_deliveries(s.drop_delivery(s.generate(spec), "sub-1", "pub-1", 12), "sub-1", "pub-1", 16, 17)
        small = s.write_run(Path(tmp) / "small", rows, spec)
        big = Path(tmp) / "big"
        planted = bulk_history.generate(big, big_events)
        big_check = ("big", big, planted["rows"], {"durability.lost": planted["lost"],
                                                   "order.out_of_order": planted["swaps"]})
        for plan, run_dir, events, expected in (
                ("small", small, len(rows), {"durability.lost": 1, "order.out_of_order": 1}),
                *[big_check] * big_rounds):
            started = time.monotonic()
            report = check_runs([run_dir], spark=spark, plan=plan)[0]
            undecided = [i for i in report["invariants"] if i["verdict"] == "unknown"]
            checks.append(WarmUpCheck(plan, events, round(time.monotonic() - started, 1), expected, findings(report),
                                      f"{undecided[0]['id']}: {undecided[0]['reason']}" if undecided else ""))
    return checks
