"""The soak: an hour of chaos-mix's faults at 500 msg/s (scenarios/soak.toml), then what the harness's own
resources did over it (<run dir>/resources.jsonl, harness/resources.py) and how long its check takes.

    .venv/bin/python benchmarks/soak.py                    # the full 60-minute scenario
    .venv/bin/python benchmarks/soak.py --short            # the same scenario, its workload cut to 3 minutes
    .venv/bin/python benchmarks/soak.py --short --record   # also into docs/measurements.md
    .venv/bin/python benchmarks/soak.py --pairs 25         # 60 minutes at half the rate (25 pairs x 10 msg/s)
    .venv/bin/python benchmarks/soak.py --run-dir RUN      # only the report, of a stored soak run
    .venv/bin/python benchmarks/soak.py --run-dir RUN --standalone   # ... and its check on a standalone cluster too

Runs ``ordeal run SCENARIO --seed N --out OUT --no-check``, then times the whole command
``ordeal check RUN --spark-master local[2]`` (with ``--standalone`` also on a Spark standalone cluster it
starts: its verdicts and counts must agree).  Reports, from the resource series (times from the workload's
start): the harness's RSS at start, at 5 minutes (``--steady-after``) and at the end, and max / min of its RSS
after 5 minutes ("flat within 10 %" when <= 1.10); its open fds, the history's bytes and Parquet parts at the
same three points; the topology's RSS apart; the run's published / acked / delivered rates; what grew, in words.
In the short run the steady window starts at 1 minute (``--steady-after`` sets it).

``--short`` is an override of the shipped scenario, not a second file: ``overridden()`` writes a copy with
``[scenario] duration_s`` set (``--duration``) next to the run, which the run directory keeps as its
scenario.toml (its replay command names it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import record  # noqa: E402
from harness.resources import RESOURCES_FILE, leak_suspected, max_min_ratio, read_series  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "scenarios" / "soak.toml"
ORDEAL = ROOT / ".venv" / "bin" / "ordeal"
SHORT_S = 180.0
STEADY_AFTER_S = 300.0  # "after the first 5 minutes"
SHORT_STEADY_AFTER_S = 60.0
FLAT_RATIO = 1.10
FD_LEAK_BOUND = 50
_DURATION = re.compile(r"^duration_s\s*=\s*[0-9.]+\s*(#.*)?$", re.MULTILINE)  # [scenario]'s, not [faults]' list
_PAIRS = re.compile(r"^pairs\s*=\s*[0-9]+\s*(#.*)?$", re.MULTILINE)


def overridden(scenario: Path, duration_s: float | None, out_dir: Path, pairs: int | None = None) -> Path:
    """A copy of ``scenario`` with its workload cut to ``duration_s`` seconds (None: as shipped) and, with
    ``pairs``, that many publisher -> subscriber pairs (the published rate scales with it), written to
    ``out_dir``; the same name, faults and sampling.  Validated by loading it (a bad override fails here)."""
    import harness.model  # noqa: F401  (registers the stages into the scenario model)
    from contracts.scenario import load_scenario

    text = scenario.read_text(encoding="utf-8")
    parts = []
    if duration_s is not None:
        text, count = _DURATION.subn(f"duration_s = {duration_s:g}  # shortened by benchmarks/soak.py", text,
                                     count=1)
        if count != 1:
            raise ValueError(f"{scenario}: no [scenario] duration_s = N line to override")
        parts.append(f"{duration_s:g}s")
    if pairs is not None:
        text, count = _PAIRS.subn(f"pairs = {pairs}  # set by benchmarks/soak.py --pairs", text, count=1)
        if count != 1:
            raise ValueError(f"{scenario}: no [workload] pairs = N line to override")
        parts.append(f"{pairs}pairs")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{'-'.join([scenario.stem, *parts])}.toml"
    path.write_text(text, encoding="utf-8")
    load_scenario(path)
    return path


def run_soak(scenario: Path, seed: int, out: Path) -> tuple[Path, int, float]:
    """(run dir, exit code, wall seconds) of ``ordeal run ... --no-check``."""
    began = time.monotonic()
    done = subprocess.run([str(ORDEAL), "run", str(scenario), "--seed", str(seed), "--out", str(out), "--no-check"],
                          cwd=ROOT, stdout=subprocess.PIPE, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    if not lines or not Path(lines[-1]).is_dir():
        raise RuntimeError(f"ordeal run exited {done.returncode} without naming a run directory")
    return Path(lines[-1]), done.returncode, time.monotonic() - began


def time_check(run_dir: Path, spark_master: str, env: dict[str, str] | None = None) -> tuple[int, float]:
    began = time.monotonic()
    done = subprocess.run([str(ORDEAL), "check", str(run_dir), "--spark-master", spark_master], cwd=ROOT,
                          stdout=subprocess.DEVNULL, check=False, env={**os.environ, **(env or {})})
    return done.returncode, time.monotonic() - began


def check_figures(run_dir: Path, spark_master: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """The whole ``ordeal check`` on ``spark_master``: its exit code, wall seconds, and the report's verdicts and
    counts (what must agree between engines)."""
    code, seconds = time_check(run_dir, spark_master, env)
    report = json.loads((run_dir / "report.json").read_text())
    verdicts = {i["id"]: [i.get("verdict"), i.get("count")] for i in report.get("invariants", [])}
    return {"spark_master": spark_master, "exit": code, "whole_command_s": round(seconds, 1),
            "verdict": report.get("verdict"), "invariants": len(verdicts),
            "failed": {k: count for k, (verdict, count) in verdicts.items() if verdict == "fail"},
            "verdicts_and_counts": verdicts}


def standalone_check(run_dir: Path, executor_memory: str) -> dict[str, Any]:
    """``check_figures`` on a Spark standalone cluster of the installed pyspark (a master and two workers, 1 core
    each, started and ended here: tests/support/spark_standalone.py), its executors ``executor_memory`` each."""
    from tests.support.spark_standalone import standalone_cluster

    worker_mib = _size_mib(executor_memory) + 512  # the worker offers the executor's heap and its overhead
    with tempfile.TemporaryDirectory(prefix="ordeal-soak-standalone-") as work:
        with standalone_cluster(Path(work), executor_memory=executor_memory,
                                worker_memory=f"{worker_mib}m") as cluster:
            figures = check_figures(run_dir, cluster.master_url, cluster.env)
    return {**figures, "spark_master": "spark://127.0.0.1 (master + 2 workers x 1 core)",
            "executor_memory": executor_memory}


def _size_mib(size: str) -> int:
    match = re.fullmatch(r"([0-9]+)([mg])", size.strip().lower())
    if match is None:
        raise ValueError(f"--executor-memory {size!r}: expected a size like 512m or 2g")
    return int(match.group(1)) * (1024 if match.group(2) == "g" else 1)


def _mib(value: Any) -> float | None:
    return None if value is None else round(value / 2**20, 1)


def resource_figures(run_dir: Path, steady_after_s: float) -> dict[str, Any]:
    """The series' figures (times from the first sample: the workload's start)."""
    header, samples = read_series(run_dir / RESOURCES_FILE)
    if not samples:
        raise RuntimeError(f"{run_dir / RESOURCES_FILE}: no samples")
    origin = samples[0]["elapsed_s"]
    series = [dict(s, t_s=round(s["elapsed_s"] - origin, 3)) for s in samples]
    steady_point = next((s for s in series if s["t_s"] >= steady_after_s), None)
    points = {"start": series[0], f"{steady_after_s:g}s": steady_point, "end": series[-1]}
    # The steady window ends with the planned workload: the samples after it are the clients leaving (the
    # harness's threads and buffers go with them), a drop in RSS, not a sign of its steady state.
    planned_s = _planned_s(run_dir)
    steady = [s for s in series if s["t_s"] >= steady_after_s and (planned_s is None or s["t_s"] <= planned_s)]
    rss_ratio = max_min_ratio([s["harness_rss_bytes"] for s in steady])
    with_end = max_min_ratio([s["harness_rss_bytes"] for s in series if s["t_s"] >= steady_after_s])
    figures: dict[str, Any] = {"samples": len(series), "every_s": header.get("every_s"),
                               "workload_s": series[-1]["t_s"]}
    for name, point in points.items():
        figures[name] = None if point is None else {
            "t_s": point["t_s"], "harness_rss_mib": _mib(point["harness_rss_bytes"]),
            "harness_fds": point["harness_fds"], "harness_threads": point["harness_threads"],
            "history_mib": _mib(point["history_bytes"]), "history_parts": point["history_parts"],
            "topology_rss_mib": _mib(point["topology_rss_bytes"])}
    figures["steady_window_s"] = [steady_after_s, planned_s]
    if steady:
        top = max(steady, key=lambda s: s["harness_rss_bytes"])
        figures["harness_rss_steady_max"] = {"t_s": top["t_s"], "harness_rss_mib": _mib(top["harness_rss_bytes"])}
    figures["harness_rss_after_steady_max_over_min"] = None if rss_ratio is None else round(rss_ratio, 3)
    figures["harness_rss_max_over_min_with_the_end"] = None if with_end is None else round(with_end, 3)
    figures["harness_rss_flat_within_10pct"] = rss_ratio is not None and rss_ratio <= FLAT_RATIO
    figures["harness_fds_climb_monotonically"] = leak_suspected([s["harness_fds"] for s in steady], FD_LEAK_BOUND)
    figures["growth"] = growth_in_words(series, steady_after_s, rss_ratio)
    return figures


def _planned_s(run_dir: Path) -> float | None:
    """The planned workload's length (summary.json plan.duration_s), or None when the run recorded none."""
    try:
        return float(json.loads((run_dir / "summary.json").read_text())["plan"]["duration_s"])
    except (OSError, KeyError, TypeError, ValueError):
        return None


def growth_in_words(series: list[dict[str, Any]], steady_after_s: float, rss_ratio: float | None) -> list[str]:
    """What grows over the run and why, from the series."""
    first, last = series[0], series[-1]
    minutes = max(last["t_s"] - first["t_s"], 1e-9) / 60
    words = []
    history_rate = (last["history_bytes"] - first["history_bytes"]) / 2**20 / minutes
    parts_rate = (last["history_parts"] - first["history_parts"]) / minutes
    words.append(f"history: +{history_rate:.1f} MiB and +{parts_rate:.0f} Parquet parts per minute, linear in "
                 "the rows recorded (a part every second or 5000 rows: harness/history.py); an hour keeps "
                 f"about {history_rate * 60:.0f} MiB in {parts_rate * 60:.0f} parts for the check to read")
    steady = [s for s in series if s["t_s"] >= steady_after_s]
    if rss_ratio is None or not steady:
        words.append(f"harness RSS: the run ended before {steady_after_s:g} s: no steady window")
    else:
        grew = (steady[-1]["harness_rss_bytes"] - steady[0]["harness_rss_bytes"]) / 2**20
        words.append(f"harness RSS after {steady_after_s:g} s: max/min {rss_ratio:.3f}, "
                     f"{grew:+.1f} MiB from the window's start to its end"
                     + (" (flat within 10 %)" if rss_ratio <= FLAT_RATIO else
                        " (not flat: something the harness keeps grows with the run; the executor's per-message "
                        "bookkeeping — the owed deliveries and the last deliveries seen, harness/drain.py — grows "
                        "with the messages in flight)"))
    fds = [s["harness_fds"] for s in series if s["harness_fds"] is not None]
    if fds:
        words.append(f"harness fds: {fds[0]} -> {max(fds)} max -> {fds[-1]} at the end "
                     "(client sockets come and go with flaps, storms and broker kills)")
    return words


def run_counts(run_dir: Path) -> dict[str, Any]:
    summary = json.loads((run_dir / "summary.json").read_text())
    counts, timings = summary.get("counts", {}), summary.get("timings_s", {})
    workload_s = timings.get("workload_s") or summary.get("plan", {}).get("duration_s") or 1
    return {"published_per_s": round(counts.get("published", 0) / workload_s, 1),
            "acked_per_s": round(counts.get("acked", 0) / workload_s, 1),
            "delivered_per_s": round(counts.get("delivered", 0) / workload_s, 1),
            "history_rows": counts.get("rows"), "faults_started": counts.get("faults_started"),
            "fault_errors": counts.get("fault_errors"), "drain": (summary.get("drain") or {}).get("reason"),
            "drain_s": timings.get("drain_s"), "run_exit": summary.get("run_exit_code")}


def workload_rates(run_dir: Path) -> dict[str, Any]:
    """What the pipeline sustained while the workload played (the resource series' first to last sample, on the
    history's clock): publishes acknowledged and deliveries per second, and the deliveries still owed at the
    workload's end (acknowledged minus delivered: the backlog the drain inherits)."""
    import pyarrow.compute as pc

    from contracts.history_schema import Kind
    from harness.history import read_history

    _header, samples = read_series(run_dir / RESOURCES_FILE)
    start_us, end_us = int(samples[0]["elapsed_s"] * 1e6), int(samples[-1]["elapsed_s"] * 1e6)
    table = read_history(run_dir / "history").select(["kind", "t_mono_us"])
    inside = table.filter(pc.and_(pc.greater_equal(table["t_mono_us"], start_us),
                                  pc.less_equal(table["t_mono_us"], end_us)))
    kinds = inside["kind"].to_pylist()
    seconds = max((end_us - start_us) / 1e6, 1e-9)
    acked, delivered = kinds.count(Kind.PUBLISH_ACK), kinds.count(Kind.DELIVERY)
    return {"published_per_s": round(kinds.count(Kind.PUBLISH_INVOKE) / seconds, 1),
            "acked_per_s": round(acked / seconds, 1), "delivered_per_s": round(delivered / seconds, 1),
            "owed_at_workload_end": acked - delivered}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--short", action="store_true", help=f"cut the workload to --duration ({SHORT_S:g} s)")
    parser.add_argument("--duration", type=float, default=SHORT_S, help="the --short workload, seconds")
    parser.add_argument("--pairs", type=int, default=None,
                        help="publisher -> subscriber pairs instead of the scenario's (its rate scales with them)")
    parser.add_argument("--scenario", type=Path, default=SCENARIO)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "soak")
    parser.add_argument("--steady-after", type=float, default=None,
                        help=f"start of the steady window, s (default {STEADY_AFTER_S:g}; --short "
                             f"{SHORT_STEADY_AFTER_S:g})")
    parser.add_argument("--spark-master", default="local[2]")
    parser.add_argument("--no-check", action="store_true", help="skip the timed check")
    parser.add_argument("--standalone", action="store_true",
                        help="also time the check on a Spark standalone cluster (master + 2 workers, started here) "
                             "and compare its verdicts and counts with --spark-master's")
    parser.add_argument("--executor-memory", default="2g", help="--standalone: each executor's heap")
    parser.add_argument("--run-dir", type=Path, default=None, help="report on this stored run; run nothing")
    parser.add_argument("--record", action="store_true",
                        help="also append the figures to docs/measurements.md (benchmarks/record.py)")
    args = parser.parse_args(argv)
    if args.duration <= 0:
        parser.error("--duration must be positive")
    if args.pairs is not None and args.pairs < 1:
        parser.error("--pairs must be at least 1")
    steady_after = args.steady_after if args.steady_after is not None else (
        SHORT_STEADY_AFTER_S if args.short else STEADY_AFTER_S)
    result: dict[str, Any] = {}
    if args.run_dir is None:
        if args.short or args.pairs is not None:
            scenario = overridden(args.scenario, args.duration if args.short else None, args.out, args.pairs)
        else:
            scenario = args.scenario
        run_dir, run_exit, run_s = run_soak(scenario, args.seed, args.out)
        result["run_wall_s"] = round(run_s, 1)
    else:
        run_dir, run_exit = args.run_dir, None
    result["run_dir"] = str(run_dir)
    result["run"] = run_counts(run_dir)
    result["during_workload"] = workload_rates(run_dir)
    result["resources"] = resource_figures(run_dir, steady_after)
    if not args.no_check:
        result["check"] = check_figures(run_dir, args.spark_master)
        if args.standalone:
            result["check_standalone"] = standalone_check(run_dir, args.executor_memory)
            # the same exit code, verdict, and every invariant's verdict and count
            result["check_standalone"]["agrees"] = all(
                result["check_standalone"][k] == result["check"][k] for k in ("exit", "verdict", "verdicts_and_counts"))
        for checked in (result["check"], result.get("check_standalone") or {}):
            checked.pop("verdicts_and_counts", None)  # compared above; the report.json has them
    print(json.dumps(result, indent=2))
    print("\n".join(result["resources"]["growth"]), file=sys.stderr)
    if args.record:
        record.append("benchmarks/soak.py", record.command_line(__file__, argv),
                      record.figures(result, drop=("run_dir",)))
    return 0 if run_exit in (None, 0, 1, 2) else 1


if __name__ == "__main__":
    sys.exit(main())
