"""Benchmark of the checkers: first the per-run latency (10k, 100k, 1M events; cold and warm in a classic
in-process session and on the shared Spark Connect server, whose cold figure is a new server that maps the class
archive an earlier one left, and steady on the server after many checks), then all
checkers at 1M and 10M events on local[2], side by side with (a) a raw Parquet scan of the same files, (b) one
shuffle + sort of the deliveries by subscriber (the floor of any Spark plan that orders each subscriber's
deliveries) and (c) the loss + order rules in DuckDB, single process (three times over the run: the ratios
use the fastest); each history is checked four times, the
second time in a JVM that has checked it before (``check_again_s``), the fastest of the second to fourth
(``check_steady_s``: a long-lived server's figure, the fastest of three like DuckDB's), and once
more in a fresh JVM after the product's warm-up (``check_warmed_s``: `ordeal spark start --warm-up`).  The warm
latency figures check each history both ways a small check can materialise its tables
($ORDEAL_CHECKER_FREEZE: persist, the old way, and checkpoint, the new), interleaved, and give the new/old
ratio.  Every figure of one invocation is measured in the same conditions: compare ratios, not seconds across
runs (the machine is shared).

    .venv/bin/python benchmarks/checkers.py [--latency 10000 100000 1000000] [--events 1000000 10000000] [--record]
    .venv/bin/python benchmarks/checkers.py --whole-command 10000 100000 [--record]   # `ordeal check` beside DuckDB
    .venv/bin/python benchmarks/checkers.py --whole-command 10000 --arm checkpoint:ORDEAL_CHECKER_FREEZE=checkpoint \
        --arm persist:ORDEAL_CHECKER_FREEZE=persist   # two ways of the check, interleaved, beside DuckDB

``--record`` also appends the figures to docs/measurements.md (benchmarks/record.py).

The history is synthetic and columnar (numpy + pyarrow, seconds for 10M rows): the seeds' P2P pattern, every
publisher with its own persistent subscriber, packet ids that wrap, and anomalies planted at known places
(``--lost`` dropped deliveries, ``--swaps`` swapped neighbours) so the timing also proves the answer.

With $ORDEAL_SPARK_EVENT_LOG set to a directory, every JVM writes Spark's event log there, and each timed check's
jobs carry its label as their job group (p2p-10000000-first, -again, -steady1, -steady2, -warmed): then
``benchmarks/stages.py LOG --group LABEL`` says where that check's task time went, job by job.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from contracts.history_schema import MANIFEST_NAME, Kind
from spark_checkers.api import findings
from spark_checkers.bulk_history import generate


def jvm_threads(spark) -> dict[str, tuple[str, float]]:
    """The classic session's JVM threads: thread id -> (name, CPU-seconds so far), from /proc ({} if unknown)."""
    try:
        pid = spark.sparkContext._gateway.proc.pid
        tick = os.sysconf("SC_CLK_TCK")
        threads = {"process": ("process", sum(map(int, Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1]
                                                   .split()[11:13])) / tick)}
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                name = Path(f"/proc/{pid}/task/{task}/comm").read_text().strip()
                fields = Path(f"/proc/{pid}/task/{task}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # the thread ended meanwhile
            threads[task] = (name, (int(fields[11]) + int(fields[12])) / tick)
        return threads
    except (AttributeError, OSError, ValueError, IndexError):
        return {}


def jvm_cpu_seconds(before: dict, after: dict) -> dict[str, float]:
    """CPU-seconds the JVM used between two ``jvm_threads`` readings, in all ("total") and by thread group: the
    task threads (rows), the JIT compilers, the driver's own threads (analysis, planning, codegen), GC.  A
    thread that ended in between is counted in the total only.  On a loaded machine wall time inflates
    several-fold; CPU-seconds much less, and they say where the time goes."""
    if not before or not after:
        return {}
    groups = {"total": round(after["process"][1] - before["process"][1], 1)}
    for tid, (name, cpu) in after.items():
        if tid == "process":
            continue
        group = ("tasks" if name.startswith("Executor task") else "jit" if "Compiler" in name
                 else "gc" if name.startswith("GC ") else "driver" if name.startswith("Thread-") else "other")
        groups[group] = round(groups.get(group, 0.0) + cpu - before.get(tid, (name, 0.0))[1], 1)
    return groups


def raw_scan_seconds(spark, run_dir: Path) -> float:
    """Read every column of every row once (Spark's noop sink), the floor for any checker."""
    started = time.monotonic()
    spark.read.parquet(str(run_dir / "history" / "events-*.parquet")).write.format("noop").mode("overwrite").save()
    return time.monotonic() - started


def one_shuffle_seconds(spark, run_dir: Path) -> float:
    """The deliveries moved by subscriber and sorted within each partition, once: the least a Spark checker that
    orders each subscriber's deliveries must do (every rule needs at least this, on top of the scan)."""
    from pyspark.sql import functions as F

    started = time.monotonic()
    events = spark.read.parquet(str(run_dir / "history" / "events-*.parquet"))
    deliveries = events.filter(F.col("kind").isin(Kind.DELIVERY, Kind.DELIVERY_ACK_SENT)).select(
        "client", "seq", "t_mono_us", "kind", "packet_id", "publisher", "pub_seq", "body_hash", "topic", "qos", "dup")
    (deliveries.repartition("client").sortWithinPartitions("client", "packet_id", "seq")
     .write.format("noop").mode("overwrite").save())
    return time.monotonic() - started


DUCKDB_SQL = """
WITH ev AS (SELECT * FROM read_parquet('{glob}')),
subs AS (SELECT client, topic AS filter FROM ev WHERE kind = 'subscribe_ack'),
pubs AS (SELECT publisher, pub_seq, any_value(topic) FILTER (WHERE kind = 'publish_invoke') AS topic,
                bool_or(kind = 'publish_ack') AS acked
         FROM ev WHERE kind IN ('publish_invoke', 'publish_ack') GROUP BY ALL),
matches AS (SELECT t.topic, s.client FROM (SELECT DISTINCT topic FROM pubs) t JOIN subs s
            ON regexp_full_match(t.topic, replace(replace(s.filter, '+', '[^/]+'), '#', '.*'))),
owed AS (SELECT p.publisher, p.pub_seq, m.client FROM pubs p JOIN matches m USING (topic) WHERE p.acked),
firsts AS (SELECT client, publisher, pub_seq, min(seq) AS first_seq FROM ev WHERE kind = 'delivery' GROUP BY ALL),
lost AS (SELECT count(*) AS n FROM owed o ANTI JOIN firsts f USING (client, publisher, pub_seq)),
ordered AS (SELECT pub_seq < max(pub_seq) OVER (PARTITION BY client, publisher ORDER BY first_seq
                   ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS inverted FROM firsts)
SELECT (SELECT n FROM lost) AS lost, (SELECT count(*) FROM ordered WHERE inverted) AS out_of_order
"""


def duckdb_seconds(run_dir: Path) -> tuple[float, dict]:
    import duckdb

    started = time.monotonic()
    con = duckdb.connect()
    con.execute("SET threads = 2")
    lost, inverted = con.execute(DUCKDB_SQL.format(glob=run_dir / "history" / "events-*.parquet")).fetchone()
    con.close()
    return time.monotonic() - started, {"lost": lost, "out_of_order": inverted}


COLD_CLASSIC = """
import json, sys, time
t0 = time.monotonic()
from spark_checkers.api import check_runs
from spark_checkers.engine.spark_session import spark_session
spark = spark_session("local[2]")
spark.range(1).count()
t1 = time.monotonic()
report = check_runs([sys.argv[1]], spark=spark)[0]
print(json.dumps({"start_s": t1 - t0, "check_s": time.monotonic() - t1, "verdict": report["verdict"]}))
"""


def _child_json(args: list[str]) -> dict | list:
    """Run ``python ARGS`` (this script or a ``-c`` snippet) with the repository importable and its stderr passed
    through; the JSON of its last stdout line.  A classic session's JVM lives as long as its process, and pyspark
    refuses classic and Connect sessions in one process: a fresh JVM, or Connect, is a child."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, *args], stdout=subprocess.PIPE, text=True,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    if done.returncode != 0:
        raise RuntimeError(f"the benchmark's child {args[:2]} failed with {done.returncode} (its stderr is above)")
    return json.loads(done.stdout.strip().splitlines()[-1])


FREEZE_MODES = ("persist", "checkpoint")  # the old way a small check materialised its tables, and the new
STEADY_ROUNDS = 10  # rounds over every latency size on one Spark Connect server (connect_latency)


def _warm_side_by_side(spark, run_dir: Path, repeats: int) -> dict:
    """Warm checks of one history with each materialisation ($ORDEAL_CHECKER_FREEZE), interleaved (the order
    alternates per repeat) so both see the same load: best time of each, the new/old ratio, and what each
    found (must be equal)."""
    from spark_checkers.api import check_runs

    times: dict[str, list[float]] = {m: [] for m in FREEZE_MODES}
    found: dict[str, dict] = {}
    before = os.environ.get("ORDEAL_CHECKER_FREEZE")
    try:
        for repeat in range(repeats):
            for mode in FREEZE_MODES if repeat % 2 == 0 else FREEZE_MODES[::-1]:
                os.environ["ORDEAL_CHECKER_FREEZE"] = mode
                started = time.monotonic()
                report = check_runs([run_dir], spark=spark)[0]
                times[mode].append(time.monotonic() - started)
                found[mode] = findings(report)
    finally:
        os.environ.pop("ORDEAL_CHECKER_FREEZE", None)
        if before is not None:
            os.environ["ORDEAL_CHECKER_FREEZE"] = before
    old, new = (min(times[m]) for m in FREEZE_MODES)
    return {"warm_s": round(new, 2), "warm_old_s": round(old, 2), "warm_new_vs_old": round(new / old, 2),
            "found": found["checkpoint"], "same_found": found["checkpoint"] == found["persist"]}


def per_run_latency(sizes: list[int], out: Path, repeats: int = 2, warm_only: bool = False) -> list[dict]:
    """Per-run check latency, the figure a command pays: for each history size, a classic in-process session
    and the shared Spark Connect server, cold (a fresh JVM: engine start + the first check, each measured) and
    warm (the engine has checked before; best of ``repeats`` further checks).  Side by side in one run, with the
    DuckDB loss + order rules on the same files as the yardstick."""

    from spark_checkers.api import check_runs
    from spark_checkers.engine import spark_session as session

    dirs = {}
    for events in sizes:
        dirs[events] = out / f"latency-{events}"
        if not (dirs[events] / "history" / MANIFEST_NAME).exists():
            generate(dirs[events], events)
    rows = {events: {"events": events} for events in sizes}
    for events in sizes:
        rows[events]["duckdb_s"] = round(duckdb_seconds(dirs[events])[0], 2)
        if warm_only:
            continue
        # Classic cold: what a command paid before the shared server (its own JVM, then the check).
        cold = _child_json(["-c", COLD_CLASSIC, str(dirs[events])])
        rows[events].update(classic_cold_start_s=round(cold["start_s"], 2), classic_cold_check_s=round(cold["check_s"], 2))
        print(json.dumps(rows[events]), flush=True)
    classic = session.spark_session("local[2]")
    for events in sizes:
        check_runs([dirs[events]], spark=classic)  # warm-up of this size
        warm = _warm_side_by_side(classic, dirs[events], repeats)
        rows[events].update({f"classic_{k}" if k.startswith("warm") else k: v for k, v in warm.items()})
        print(json.dumps(rows[events]), flush=True)
    if warm_only:
        for row in rows.values():
            row["load_avg_1m"] = round(os.getloadavg()[0], 1)
            print(json.dumps(row), flush=True)
        return list(rows.values())
    # Spark Connect in a process of its own: pyspark refuses classic and Connect sessions in one process (a
    # Connect session switches pyspark.sql.functions to Connect columns process-wide).
    for row in _child_json([__file__, "--connect-child", "--out", str(out), "--events", "--latency", *map(str, sizes)]):
        rows[row["events"]].update(row)
    for row in rows.values():
        row["connect_warm_vs_classic_warm"] = round(row["connect_warm_s"] / row["classic_warm_s"], 2)
        row["connect_warm_vs_duckdb"] = round(row["connect_warm_s"] / max(row["duckdb_s"], 0.01), 1)
        if "connect_steady_s" in row:
            row["connect_steady_vs_warm"] = round(row["connect_steady_s"] / row["connect_warm_s"], 2)
            row["connect_steady_vs_duckdb"] = round(row["connect_steady_s"] / max(row["duckdb_s"], 0.01), 1)
        row["classic_cold_total_vs_connect_warm"] = round(
            (row["classic_cold_start_s"] + row["classic_cold_check_s"]) / row["connect_warm_s"], 1)
        row["load_avg_1m"] = round(os.getloadavg()[0], 1)
        print(json.dumps(row), flush=True)
    return list(rows.values())


def connect_latency(sizes: list[int], out: Path, repeats: int = 2, steady_rounds: int = STEADY_ROUNDS) -> list[dict]:
    """The Spark Connect half of per_run_latency (run in a child process): cold = a fresh local server's
    start, then its first check; warm = best of ``repeats`` further checks; steady = the median check of the
    later half of ``steady_rounds`` rounds over every size on one server (the one a nightly explore, or a
    laptop after a few commands, checks on)."""
    import statistics
    import sys

    from spark_checkers.api import check_runs
    from spark_checkers.engine import connect_server
    from spark_checkers.engine import spark_session as session

    dirs = {events: out / f"latency-{events}" for events in sizes}
    rows = {events: {"events": events} for events in sizes}
    # A private state directory, so this benchmark's server is its own.
    os.environ["ORDEAL_CACHE_DIR"] = str((out / "cache").resolve())
    spark = None
    try:
        # A new server maps the class archive that the first server to stop on a machine leaves behind
        # (connect_server.ClassArchive).  One server is started and stopped first, so that every cold figure
        # below is such a server's, as a user's are after their first.
        connect_server.ensure_started()
        connect_server.release_lease()
        connect_server.stop()
        archive_dir = connect_server.archive_dir()
        archived = archive_dir is not None and any(archive_dir.glob("*.jsa"))
        for events in sizes:
            if spark is not None:
                spark.stop()  # before its server goes: a client of a dead server retries for minutes at exit
            connect_server.release_lease()
            connect_server.stop()
            started = time.monotonic()
            spark = session.local_connect_session()
            spark.range(1).count()
            start_s = time.monotonic() - started
            started = time.monotonic()
            check_runs([dirs[events]], spark=spark)
            rows[events].update(connect_class_archive=archived, connect_cold_start_s=round(start_s, 2),
                                connect_cold_check_s=round(time.monotonic() - started, 2))
            warm = _warm_side_by_side(spark, dirs[events], repeats)
            rows[events].update(connect_warm_s=warm["warm_s"], connect_warm_old_s=warm["warm_old_s"],
                                connect_warm_new_vs_old=warm["warm_new_vs_old"], connect_found=warm["found"],
                                connect_same_found=warm["same_found"])
            print(json.dumps(rows[events]), file=sys.stderr, flush=True)
        # Why rounds over every size on one server: "warm" above is a server that has checked 2-5 histories,
        # and its JIT is still compiling; measured, a 10k check kept getting faster for ~15-20 checks (5.9 s
        # after 2, 4.1 s after 20).  The later half of the rounds is the server a nightly run checks on.
        times: dict[int, list[float]] = {events: [] for events in sizes}
        for _ in range(steady_rounds):
            for events in sizes:
                started = time.monotonic()
                check_runs([dirs[events]], spark=spark)
                times[events].append(time.monotonic() - started)
        # The server had checked the last size cold, then warm (both freeze modes), before the rounds began.
        before_rounds = 1 + repeats * len(FREEZE_MODES)
        for events in sizes:
            later = times[events][steady_rounds // 2:]
            if later:
                rows[events].update(connect_steady_s=round(statistics.median(later), 2),
                                    connect_steady_best_s=round(min(later), 2),
                                    connect_steady_checks_before=before_rounds + steady_rounds // 2 * len(sizes))
    finally:
        if spark is not None:
            spark.stop()
        connect_server.release_lease()
        connect_server.stop()
    return list(rows.values())


DUCKDB_WHOLE = """
import json, sys, time
sys.path.insert(0, sys.argv[2])
from benchmarks.checkers import duckdb_seconds
print(json.dumps(duckdb_seconds(__import__("pathlib").Path(sys.argv[1]))[1]))
"""


def whole_command(sizes: list[int], out: Path, repeats: int = 5, warm_checks: int = 20,
                  arms: dict[str, dict[str, str]] | None = None) -> list[dict]:
    """``ordeal check`` as a user runs it, a whole process on a warm shared server (a private one here, warmed by
    ``warm_checks`` checks: the server a nightly, or a laptop after a few commands, checks on), beside a whole
    process that runs the DuckDB loss + order rules on the same files, interleaved per repeat.  The figures:
    the median wall time of each; the check's own part (report.json's ``check_seconds``) and the command's
    CPU-seconds (the client: imports, the session, the reports) say where the rest goes.

    ``arms``: name -> environment of the check command (``--arm``), each arm's check timed in every repeat,
    interleaved with the others' and DuckDB's, and reported in a row of its own (with its median over the
    first arm's); every arm's exit code and failed counts must agree."""
    arms = arms or {"default": {}}
    import resource
    import statistics
    import subprocess
    import sys

    from spark_checkers.engine import connect_server

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "ORDEAL_CACHE_DIR": str((out / "whole-cache").resolve())}
    dirs = {}
    for events in sizes:
        dirs[events] = out / f"latency-{events}"
        if not (dirs[events] / "history" / MANIFEST_NAME).exists():
            generate(dirs[events], events)

    def timed(argv: list[str], extra: dict[str, str] | None = None) -> tuple[float, float, int]:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.monotonic()
        code = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**env, **(extra or {})},
                              cwd=root).returncode
        wall = time.monotonic() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), code

    ordeal = [sys.executable, "-m", "ordeal.cli"]
    rows = []
    try:
        subprocess.run([*ordeal, "spark", "start"], check=True, env=env, cwd=root, stdout=subprocess.DEVNULL)
        for i in range(warm_checks):
            timed([*ordeal, "check", str(dirs[sizes[i % len(sizes)]])])
        for events in sizes:
            measured = {arm: {"whole": [], "cpu": [], "inside": [], "codes": set(), "found": []} for arm in arms}
            duck = []
            for _ in range(repeats):
                for arm, arm_env in arms.items():
                    wall, used, code = timed([*ordeal, "check", str(dirs[events])], arm_env)
                    report = json.loads((dirs[events] / "report.json").read_text())
                    m = measured[arm]
                    m["whole"].append(wall)
                    m["cpu"].append(used)
                    m["inside"].append(report["environment"]["check_seconds"])
                    m["codes"].add(code)
                    m["found"].append(findings(report))
                duck.append(timed([sys.executable, "-c", DUCKDB_WHOLE, str(dirs[events]), str(root)])[0])
            first = statistics.median(measured[next(iter(arms))]["whole"])
            for arm, m in measured.items():
                whole, inside = m["whole"], m["inside"]
                row = {"events": events, "arm": arm, "repeats": repeats,
                       "check_command_s": round(statistics.median(whole), 2),
                       "check_command_best_s": round(min(whole), 2), "check_inside_s": round(statistics.median(inside), 2),
                       "check_command_cpu_s": round(statistics.median(m["cpu"]), 2),
                       "outside_check_s": round(statistics.median(w - c for w, c in zip(whole, inside, strict=True)), 2),
                       "duckdb_command_s": round(statistics.median(duck), 2),
                       "check_command_vs_duckdb_command": round(statistics.median(whole) / statistics.median(duck), 1),
                       "vs_first_arm": round(statistics.median(whole) / first, 2),
                       "exit_codes": sorted(m["codes"]),
                       "same_findings_every_time": all(f == m["found"][0] for f in m["found"]),
                       "findings_as_first_arm": m["found"][0] == measured[next(iter(arms))]["found"][0],
                       "load_avg_1m": round(os.getloadavg()[0], 1)}
                if len(arms) == 1:
                    del row["arm"], row["vs_first_arm"], row["findings_as_first_arm"]
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        subprocess.run([*ordeal, "spark", "stop"], env=env, cwd=root, stdout=subprocess.DEVNULL)
        connect_server.release_lease()
    return rows


def _timed_check(spark, run_dir: Path, label: str) -> tuple[float, dict, dict]:
    """(seconds, JVM CPU seconds by thread group, failed invariants' counts) of one ``check_runs``.  Its jobs
    carry the job group ``label`` in Spark's event log ($ORDEAL_SPARK_EVENT_LOG; benchmarks/stages.py --group)."""
    from spark_checkers.api import check_runs

    spark.sparkContext.setJobGroup(label, f"benchmark {label}")
    try:
        threads_before = jvm_threads(spark)
        started = time.monotonic()
        report = check_runs([run_dir], spark=spark)[0]
        checked = time.monotonic() - started
    finally:
        for key in ("spark.jobGroup.id", "spark.job.description"):  # the scans timed next are no part of it
            spark.sparkContext.setLocalProperty(key, None)
    return checked, jvm_cpu_seconds(threads_before, jvm_threads(spark)), findings(report)


def warmed_first_check(spark, run_dir: Path) -> dict:
    """A fresh JVM's first check of ``run_dir`` after the product's warm-up (``api.warm_up``: what `ordeal spark
    start --warm-up` runs), with that warm-up's own time: a server started for big histories pays this."""
    from spark_checkers.api import warm_up

    started = time.monotonic()
    warm = warm_up(spark)
    warmed = time.monotonic() - started
    checked, cpu, found = _timed_check(spark, run_dir, f"{run_dir.name}-warmed")
    return {"warm_up_s": round(warmed, 1), "warm_up_right": all(c.right for c in warm), "check_s": round(checked, 1),
            "jvm_cpu_s": cpu, "found": found}


def _arms(parser: argparse.ArgumentParser, specs: list[str]) -> dict[str, dict[str, str]] | None:
    """``--arm NAME:VAR=VALUE[,VAR=VALUE]`` -> {NAME: {VAR: VALUE}} (None: no arms, the command as it is)."""
    arms: dict[str, dict[str, str]] = {}
    for spec in specs:
        name, _, assignments = spec.partition(":")
        pairs = [a.partition("=") for a in assignments.split(",") if a]
        if not name or name in arms or any(not var or sep != "=" for var, sep, _ in pairs):
            parser.error(f"--arm {spec!r}: expected a new NAME:VAR=VALUE[,VAR=VALUE] (NAME: may have no variables)")
        arms[name] = {var: value for var, _, value in pairs}
    return arms or None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, nargs="*", default=[1_000_000, 10_000_000])
    parser.add_argument("--latency", type=int, nargs="*", default=[10_000, 100_000, 1_000_000],
                        help="History sizes for the per-run latency figures (none: skip them).")
    parser.add_argument("--warm-only", action="store_true",
                        help="Latency: only the classic session's warm figures (old vs new), no cold starts, no Connect.")
    parser.add_argument("--out", type=Path, default=Path("runs/bench-checkers"))
    parser.add_argument("--connect-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--warmed-child", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--spark-master", default="local[2]",
                        help="The 1M/10M comparison's classic session (Spark Connect figures: the latency part).")
    parser.add_argument("--whole-command", type=int, nargs="*", default=None, metavar="EVENTS",
                        help="Only `ordeal check` as a whole process on a warm server beside a whole DuckDB process, "
                             "for these history sizes (e.g. 10000 100000).")
    parser.add_argument("--arm", action="append", default=[], metavar="NAME:VAR=VALUE[,VAR=VALUE]",
                        help="--whole-command: an arm of the check command with these environment variables (repeat "
                             "for more arms; timed interleaved, the first is the baseline), e.g. "
                             "--arm checkpoint:ORDEAL_CHECKER_FREEZE=checkpoint --arm persist:ORDEAL_CHECKER_FREEZE=persist")
    parser.add_argument("--record", action="store_true",
                        help="also append the figures to docs/measurements.md (benchmarks/record.py)")
    args = parser.parse_args()
    from spark_checkers.api import check_runs
    from spark_checkers.engine.spark_session import spark_session

    if args.connect_child:
        print(json.dumps(connect_latency(args.latency, args.out)))
        return
    if args.warmed_child:
        print(json.dumps(warmed_first_check(spark_session(args.spark_master), args.warmed_child)))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    if args.whole_command is not None:
        rows = whole_command(args.whole_command or [10_000, 100_000], args.out, arms=_arms(parser, args.arm))
        (args.out / "whole-command.json").write_text(json.dumps(rows, indent=2))
        if args.record and rows:
            _record(rows)
        return
    latency = per_run_latency(args.latency, args.out, warm_only=args.warm_only) if args.latency else []
    (args.out / "latency.json").write_text(json.dumps(latency, indent=2))
    if args.record and latency:
        _record(latency)
    if not args.events:
        return
    spark = spark_session(args.spark_master)
    warm = args.out / "warm-up"
    generate(warm, 20_000)
    check_runs([warm], spark=spark)  # JIT and codegen warm-up, not timed
    results = []
    for events in args.events:
        run_dir = args.out / f"p2p-{events}"
        started = time.monotonic()
        planted = generate(run_dir, events)
        generated = time.monotonic() - started
        # DuckDB three times, spread over the run (before the Spark figures, between the checks, after the fresh
        # JVM's): one measurement of it varied by a quarter between invocations here (11.3 and 14.1 s), and every
        # ratio below divides by it.  The ratios use the fastest of the three, the strictest comparison (the one
        # right after the checks was the slowest each time: the JVM beside it may still be compiling); all
        # three are reported.
        first_duck, duck_found = duckdb_seconds(run_dir)
        duck_runs = [first_duck]
        scan = raw_scan_seconds(spark, run_dir)
        shuffle = one_shuffle_seconds(spark, run_dir)
        load_before = os.getloadavg()[0]
        checked, cpu, found = _timed_check(spark, run_dir, f"{run_dir.name}-first")
        # The same history once more in the same JVM: what a long-lived server pays once it has checked a
        # history of this size (its code compiled by the JIT), beside the first check's figure above.
        checked_again, cpu_again, found_again = _timed_check(spark, run_dir, f"{run_dir.name}-again")
        # And twice more: a long-lived server's steady figure is the fastest of its three warm checks, the
        # statistic the DuckDB figure is (the fastest of three runs).  The second check still JIT-compiles
        # more than the third and fourth (docs/measurements.md).
        steady = [_timed_check(spark, run_dir, f"{run_dir.name}-steady{i}") for i in (1, 2)]
        warm_runs = [checked_again, *[t for t, _, _ in steady]]
        duck_runs.append(duckdb_seconds(run_dir)[0])
        # And a fresh JVM's first check after the product's warm-up (this JVM idles meanwhile).
        warmed = _child_json([__file__, "--warmed-child", str(run_dir), "--spark-master", args.spark_master])
        duck_runs.append(duckdb_seconds(run_dir)[0])
        duck = min(duck_runs)
        row = {"events": planted["rows"], "generate_s": round(generated, 1), "check_s": round(checked, 1),
               "check_again_s": round(checked_again, 1), "check_again_vs_duckdb": round(checked_again / duck, 1),
               "check_again_jvm_cpu_s": cpu_again, "found_again_same": found_again == found,
               "check_warm_runs_s": [round(x, 1) for x in warm_runs], "check_steady_s": round(min(warm_runs), 1),
               "check_steady_vs_duckdb": round(min(warm_runs) / duck, 2),
               "found_steady_same": all(f == found for _, _, f in steady),
               "check_warmed_s": warmed["check_s"], "check_warmed_vs_duckdb": round(warmed["check_s"] / duck, 1),
               "warm_up_s": warmed["warm_up_s"], "warm_up_right": warmed["warm_up_right"],
               "check_warmed_jvm_cpu_s": warmed["jvm_cpu_s"], "found_warmed_same": warmed["found"] == found,
               "raw_scan_s": round(scan, 1), "one_shuffle_s": round(shuffle, 1), "duckdb_s": round(duck, 1),
               "duckdb_runs_s": [round(x, 1) for x in duck_runs],
               "check_vs_scan": round(checked / scan, 1), "one_shuffle_vs_scan": round(shuffle / scan, 1),
               "check_vs_duckdb": round(checked / duck, 1),
               "load_avg_1m": [round(load_before, 1), round(os.getloadavg()[0], 1)], "check_jvm_cpu_s": cpu,
               "planted": planted, "found": found, "duckdb_found": duck_found}
        results.append(row)
        print(json.dumps(row), flush=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    if args.record and results:
        _record(results)


def _record(rows: list[dict]) -> None:
    """``--record``: append these rows, one column per history size, to docs/measurements.md."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from benchmarks import record

    if any("arm" in row for row in rows):  # one column per (history size, arm)
        rows = [{"column": f"{row['events']} {row['arm']}", **row} for row in rows]
        record.append("benchmarks/checkers.py", record.command_line(__file__), record.transpose(rows, by="column"))
        return
    record.append("benchmarks/checkers.py", record.command_line(__file__), record.transpose(rows, by="events"))


if __name__ == "__main__":
    main()
