"""Running a self-test tier: every run played one after the other, then all of them checked in one Spark
job, judged and written (``run_selftest``); or a finished self-test judged again from its stored reports
(``rejudge``); ``write_outputs`` writes selftest.json, selftest.html, selftest-junit.xml and selftest.md."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from contracts.versions import read_json
from ordeal.selftest.judging import SelftestResult, discount_shared_failures, judge
from ordeal.selftest.matrix import REPO_ROOT, Matrix, defect_catalog, relative_to_repo
from ordeal.selftest.outputs import junit_xml, markdown, result_document
from ordeal.selftest.page import render_html
from ordeal.selftest.tier import Job, plan_jobs, scenario_with_defect
from ordeal.shard import WHOLE, Shard, shard_jobs, shard_record


def run_selftest(matrix: Matrix, tier: str, out: Path, *, repeat: int | None = None, blackbox: bool | None = None,
                 defects: tuple[str, ...] = (), seeds: tuple[int, ...] = (), spark_master: str | None = None,
                 log: Callable[[str], None] = print, shard: Shard = WHOLE) -> SelftestResult:
    """Run every job of the tier one after the other, then check all runs in one Spark job, judge, write
    selftest.json + selftest.html under ``out``.  ``shard``: only this shard's runs of the tier
    (ordeal/shard.py); selftest.json records the shard and the whole plan for ``ordeal merge``."""
    from ordeal import pipeline

    started = time.monotonic()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    planned = plan_jobs(matrix, tier, repeat=repeat, blackbox=blackbox, defects=defects, seeds=seeds)
    jobs = shard_jobs(planned, shard)
    result = SelftestResult(tier=tier, uncovered=matrix.uncovered(defect_catalog()) if not defects else (),
                            shard=shard_record(shard, planned))
    if not shard.whole:
        log(f"shard {shard}: {len(jobs)} of the tier's {len(planned)} runs")
    played: list[tuple[Job, Path | None, float | None, str, str]] = []  # job, run dir, run_s, replay, error
    for number, job in enumerate(jobs, 1):
        scenario_path = job.scenario
        if job.defect:
            scenario_path = out / "scenarios" / f"{job.scenario.stem}+{job.defect}.toml"
            scenario_path.parent.mkdir(parents=True, exist_ok=True)
            scenario_path.write_text(scenario_with_defect(job.scenario.read_text(), job.defect))
        log(f"[{number}/{len(jobs)}] {job.label}: {relative_to_repo(job.scenario)} seed {job.seed}")
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
                            errors=list(previous.get("errors", [])),
                            shard=previous.get("shard") or {**WHOLE.to_dict(),
                                                            "planned": [r["label"] for r in previous["rows"]]})
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


def write_outputs(result: SelftestResult, out: Path, matrix: Matrix) -> None:
    document = result_document(result, matrix)
    (out / "selftest.json").write_text(json.dumps(document, indent=2, default=str) + "\n")
    (out / "selftest.html").write_text(render_html(document))
    (out / "selftest-junit.xml").write_text(junit_xml(document))
    (out / "selftest.md").write_text(markdown(document))
