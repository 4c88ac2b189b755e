"""Where a check's task time went, job by job, from Spark's event log.

    ORDEAL_SPARK_EVENT_LOG=/tmp/ev .venv/bin/python benchmarks/checkers.py --events 10000000 --out OUT
    .venv/bin/python benchmarks/stages.py /tmp/ev/local-... --group check_s
    .venv/bin/python benchmarks/stages.py /tmp/ev/local-... --group check_s --record   # also into docs/measurements.md

Every JVM started while $ORDEAL_SPARK_EVENT_LOG names a directory writes its event log there, one plain JSON
file per application (spark_checkers/engine/settings.py: event_log_conf).  A check is found by its job group: the benchmark labels each
timed check (``checkers.py``: check_s, check_again_s, ...).  A check's aside threads submit jobs of their own,
without the label (a job group belongs to the thread that set it), so a check's jobs are every job submitted
between the first job of its group and the end of the last: checks that ran one after another.

Per job: its task CPU (executor CPU and deserialisation), wall time, the call site, and per stage with at least
``--min-cpu`` CPU-seconds its tasks, rows out and operators (the plan's node names, counted).  The event log
is the measurement, not a profiler: Java Flight Recorder slows a first check markedly (docs/measurements.md).  It gives the
task threads' CPU; the driver's (analysis, planning, code generation) and the JIT's are not in it
(``checkers.py``'s ``jvm_cpu_s`` gives those, by thread).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Stage:
    stage_id: int
    tasks: int
    cpu_s: float
    rows_out: int | None
    operators: tuple[tuple[str, int], ...]  # (node name, how many), most first


@dataclass(frozen=True)
class Job:
    job_id: int
    group: str | None
    call_site: str
    wall_s: float
    stages: tuple[Stage, ...] = field(default=())

    @property
    def cpu_s(self) -> float:
        return sum(s.cpu_s for s in self.stages)


def read_events(path: Path) -> Iterator[dict]:
    """The events of one event log file (JSON lines), or of every file in a directory (a rolled log, in order).
    A compressed log is refused with what to change: the session writes plain files."""
    files = sorted(path.iterdir()) if path.is_dir() else [path]
    for file in files:
        if file.suffix in (".zstd", ".lz4", ".snappy", ".lzf"):
            raise ValueError(f"{file}: a compressed event log; expected plain JSON lines "
                             "(spark.eventLog.compress=false, as $ORDEAL_SPARK_EVENT_LOG sets)")
        if file.name.startswith(".") or file.name.startswith("appstatus"):
            continue
        with file.open(encoding="utf-8") as lines:
            for number, line in enumerate(lines, 1):
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as error:
                    raise ValueError(f"{file}, line {number}: not a JSON event ({error.msg})") from None


def jobs_of(events: Iterable[dict]) -> list[Job]:
    """Every job of the log with its stages' task CPU, in submission order."""
    started: dict[int, dict] = {}
    ended: dict[int, int] = {}
    cpu: Counter = Counter()
    tasks: Counter = Counter()
    completed: dict[int, dict] = {}
    for event in events:
        kind = event.get("Event")
        if kind == "SparkListenerJobStart":
            started[event["Job ID"]] = event
        elif kind == "SparkListenerJobEnd":
            ended[event["Job ID"]] = event["Completion Time"]
        elif kind == "SparkListenerTaskEnd":
            metrics = event.get("Task Metrics") or {}
            cpu[event["Stage ID"]] += (metrics.get("Executor CPU Time", 0)
                                       + metrics.get("Executor Deserialize CPU Time", 0)) / 1e9
            tasks[event["Stage ID"]] += 1
        elif kind == "SparkListenerStageCompleted":
            completed[event["Stage Info"]["Stage ID"]] = event["Stage Info"]
    jobs = []
    for job_id, start in sorted(started.items()):
        properties = start.get("Properties") or {}
        stages = tuple(_stage(s, tasks[s], cpu[s], completed.get(s)) for s in start.get("Stage IDs", [])
                       if s in tasks)
        wall = (ended.get(job_id, start["Submission Time"]) - start["Submission Time"]) / 1e3
        jobs.append(Job(job_id, properties.get("spark.jobGroup.id"), properties.get("callSite.short", ""), wall,
                        stages))
    return jobs


def _stage(stage_id: int, tasks: int, cpu_s: float, info: dict | None) -> Stage:
    operators: Counter = Counter()
    rows = None
    for rdd in (info or {}).get("RDD Info", []):
        if rdd.get("Scope"):
            operators[json.loads(rdd["Scope"])["name"].strip()] += 1
    for accumulable in (info or {}).get("Accumulables", []):
        if accumulable.get("Name") == "number of output rows":
            rows = int(accumulable["Value"])
    return Stage(stage_id, tasks, cpu_s, rows, tuple(operators.most_common()))


def check_jobs(jobs: list[Job], group: str) -> list[Job]:
    """The jobs of the check labelled ``group``: every job between its group's first and last (module doc)."""
    mine = [j.job_id for j in jobs if j.group == group]
    if not mine:
        groups = sorted({j.group for j in jobs if j.group})
        raise ValueError(f"no job of group {group!r} in the event log; its groups: {', '.join(groups) or 'none'}")
    return [j for j in jobs if min(mine) <= j.job_id <= max(mine)]


def render(jobs: list[Job], min_cpu: float = 0.3) -> str:
    total = sum(j.cpu_s for j in jobs)
    lines = [f"{len(jobs)} jobs, task CPU {total:.1f} s", "job   cpu s  wall s  call site"]
    for job in jobs:
        if job.cpu_s < min_cpu and job.wall_s < 1.0:
            continue
        lines.append(f"{job.job_id:4d} {job.cpu_s:7.2f} {job.wall_s:7.2f}  {job.call_site}")
        for stage in job.stages:
            if stage.cpu_s >= min_cpu:
                ops = ", ".join(f"{name}×{n}" if n > 1 else name for name, n in stage.operators)
                rows = "?" if stage.rows_out is None else f"{stage.rows_out:,}"
                lines.append(f"       stage {stage.stage_id}: {stage.cpu_s:.2f} s, {stage.tasks} tasks, "
                             f"{rows} rows out; {ops}")
    return "\n".join(lines)


def figure_rows(jobs: list[Job], min_cpu: float = 0.3) -> list[dict]:
    """The jobs ``render`` shows, as table rows for the measurements log: all of them first, then each."""
    rows: list[dict] = [{"job": "all", "task_cpu_s": round(sum(j.cpu_s for j in jobs), 2), "wall_s": None,
                         "call_site": f"{len(jobs)} jobs"}]
    rows += [{"job": j.job_id, "task_cpu_s": round(j.cpu_s, 2), "wall_s": round(j.wall_s, 2), "call_site": j.call_site}
             for j in jobs if j.cpu_s >= min_cpu or j.wall_s >= 1.0]
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log", type=Path, help="an event log file (or a rolled log's directory)")
    parser.add_argument("--group", help="the check's job group (default: every job of the log)")
    parser.add_argument("--min-cpu", type=float, default=0.3, help="hide stages under this many CPU-seconds")
    parser.add_argument("--record", action="store_true",
                        help="also append the jobs shown to docs/measurements.md (benchmarks/record.py)")
    args = parser.parse_args(argv)
    try:
        jobs = jobs_of(read_events(args.log))
        shown = check_jobs(jobs, args.group) if args.group else jobs
        print(render(shown, args.min_cpu))
    except (OSError, ValueError) as error:
        print(f"stages: {error}", file=sys.stderr)
        return 3
    if args.record:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from benchmarks import record

        record.append("benchmarks/stages.py", record.command_line(__file__, argv), figure_rows(shown, args.min_cpu))
    return 0


if __name__ == "__main__":
    sys.exit(main())
