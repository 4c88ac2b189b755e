"""``ordeal merge``: the outputs of the N shards of one nightly (``--shard K/N``, ordeal/shard.py) put together
as if one machine had run them.

Input: shard directories.  A directory is a shard output when it holds ``selftest.json`` (the --out of
``ordeal selftest``) or ``explore-summary.json`` (the --out of ``ordeal explore``), or when its subdirectories
do (a nightly shard's tree, e.g. ``explore/`` and ``selftest/``: one level down is looked at).  For each kind
the shards must all be of the same N and bring every K from 1 to N exactly once; a selftest.json without a
shard record is shard 1/1 (written before sharding: the whole plan).

Output (``--out``):
  selftest/      selftest.json, selftest.html, selftest-junit.xml, selftest.md: the shards' rows in the plan's
                 order, judged together (a catch the correct broker shares on another shard is discounted
                 here), written by the self-test's own writers (ordeal/selftest/runner.py write_outputs);
                 check_s is the shards' sum, total_s the longest shard (they run side by side)
  explore/       explore-summary.json: per scenario every shard's seeds, runs and exit codes
  corpus/        every shard's corpus entries (a name taken by another shard gets ``-shard<K>``), and their
                 explored.jsonl / unknowns.jsonl lines
  junit/         selftest-junit.xml and the junit.xml of every run found, named after its run directory
  merge.json     what was merged (kinds, shards, directories) and the exit code

Exit code, as the commands decide theirs: 1 if any exploration failed a run, a defect was missed or the correct
broker violated an invariant; else 2 if anything is unknown (an exploration that ran nothing or had an unknown
run, a scenario some shard did not explore, an unknown self-test row); else 0.  Input that cannot be merged is
a ``MergeError`` (exit 3) naming the directory and what was expected.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from contracts.errors import UsageError
from contracts.exit_codes import EXIT_FAIL, EXIT_PASS, EXIT_UNKNOWN
from ordeal.explore import EXPLORE_SUMMARY_VERSION, SUMMARY_NAME
from ordeal.selftest.judging import Row, SelftestResult, discount_shared_failures
from ordeal.selftest.matrix import Matrix
from ordeal.selftest.outputs import SELFTEST_VERSION, result_document, text_table
from ordeal.selftest.runner import write_outputs
from ordeal.shard import WHOLE, Shard

SELFTEST_NAME = "selftest.json"
MERGE_NAME = "merge.json"
MERGE_VERSION = 1
KNOWN_VERSIONS = {"selftest": (SELFTEST_VERSION,), "explore": (EXPLORE_SUMMARY_VERSION,)}
EXPECTED = (f"the --out of `ordeal selftest --shard K/N` ({SELFTEST_NAME}) or of `ordeal explore --shard K/N` "
            f"({SUMMARY_NAME}), or a directory whose subdirectories are")


class MergeError(UsageError):
    """Shard outputs that cannot be merged; the message names the directory and what was expected."""


@dataclass(frozen=True)
class ShardOutput:
    kind: str  # "selftest" | "explore"
    directory: Path  # the directory holding the document
    shard: Shard
    document: dict[str, Any]


@dataclass
class MergeResult:
    exit_code: int
    lines: list[str] = field(default_factory=list)
    selftest: SelftestResult | None = None
    explore: dict[str, Any] | None = None


def combine_exit_codes(codes: Sequence[int]) -> int:
    """1 if any is 1, else 2 if any is not 0 (or there is none), else 0."""
    if any(code == EXIT_FAIL for code in codes):
        return EXIT_FAIL
    return EXIT_UNKNOWN if not codes or any(code != EXIT_PASS for code in codes) else EXIT_PASS


# ------------------------------------------------------------------------------------------- finding inputs
def find_outputs(directories: Sequence[Path]) -> list[ShardOutput]:
    """Every shard output in ``directories`` (each one itself, else its subdirectories one level down)."""
    if not directories:
        raise MergeError(f"DIR: give at least one shard directory ({EXPECTED})")
    outputs: list[ShardOutput] = []
    for directory in map(Path, directories):
        if not directory.is_dir():
            raise MergeError(f"{directory}: not a directory; expected {EXPECTED}")
        found = _outputs_in(directory)
        if not found:
            for sub in sorted(p for p in directory.iterdir() if p.is_dir()):
                found += _outputs_in(sub)
        if not found:
            raise MergeError(f"{directory}: not a shard output: no {SELFTEST_NAME} or {SUMMARY_NAME} in it or in "
                             f"its subdirectories; expected {EXPECTED}")
        outputs += found
    return outputs


def _outputs_in(directory: Path) -> list[ShardOutput]:
    found = []
    for kind, name in (("selftest", SELFTEST_NAME), ("explore", SUMMARY_NAME)):
        path = directory / name
        if path.is_file():
            document = _read(path, kind)
            found.append(ShardOutput(kind, directory, _shard_of(document, path, kind), document))
    return found


def _read(path: Path, kind: str) -> dict[str, Any]:
    try:
        document = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise MergeError(f"{path}: not readable as JSON ({error}); expected {kind} output") from error
    if not isinstance(document, dict):
        raise MergeError(f"{path}: expected a JSON object, got {type(document).__name__}")
    version = document.get("schema_version", 1)  # missing: the unversioned layout, version 1
    known = KNOWN_VERSIONS[kind]
    if isinstance(version, bool) or version not in known:
        raise MergeError(f"{path}: schema_version {version!r} is not one this version of Ordeal knows for {path.name} "
                         f"(known: {', '.join(map(str, known))}); merge it with the Ordeal that wrote it, or upgrade")
    rows_key = "rows" if kind == "selftest" else "explorations"
    if not isinstance(document.get(rows_key), list):
        raise MergeError(f"{path}: no {rows_key!r} list; expected {kind} output ({EXPECTED})")
    return document


def _shard_of(document: dict[str, Any], path: Path, kind: str) -> Shard:
    record = document.get("shard")
    if isinstance(record, dict) and "merged" in record:
        raise MergeError(f"{path}: already the output of `ordeal merge` (shards {record.get('merged')}); pass the "
                         "shard directories it was merged from")
    if record is None and kind == "selftest":  # written before sharding: the whole plan
        document["shard"] = {**WHOLE.to_dict(), "planned": [r.get("label") for r in document["rows"]]}
        return WHOLE
    return Shard.from_dict(record, str(path))


def check_shard_set(outputs: Sequence[ShardOutput], kind: str) -> int:
    """N of this kind's shards; MergeError for mixed N, a duplicated K or a missing K."""
    by_n: dict[int, list[ShardOutput]] = {}
    for output in outputs:
        by_n.setdefault(output.shard.n, []).append(output)
    if len(by_n) > 1:
        listing = "; ".join(f"{o.directory} is {o.shard}" for o in outputs)
        raise MergeError(f"{kind} shards of different N: {listing}; expected the shards of one --shard K/N split, all "
                         "with the same N")
    [n] = by_n
    seen: dict[int, ShardOutput] = {}
    for output in outputs:
        if output.shard.k in seen:
            raise MergeError(f"{output.directory}: {kind} shard {output.shard} again (also {seen[output.shard.k].directory}); "
                             f"expected each shard K of 1..{n} once")
        seen[output.shard.k] = output
    missing = [k for k in range(1, n + 1) if k not in seen]
    if missing:
        given = ", ".join(f"{o.shard} ({o.directory})" for o in sorted(outputs, key=lambda o: o.shard.k))
        raise MergeError(f"{kind}: missing shard(s) {', '.join(f'{k}/{n}' for k in missing)}; got {given}; expected "
                         f"every shard K of 1..{n} once")
    return n


# ------------------------------------------------------------------------------------------------ self-test
_ROW_FIELDS = tuple(f.name for f in fields(Row))
_TUPLES = ("expect", "failed", "unknown")


def merge_selftest(outputs: Sequence[ShardOutput]) -> SelftestResult:
    """The shards' rows in plan order, judged together; MergeError when the shards did not plan the same runs
    or do not cover the plan once."""
    outputs = sorted(outputs, key=lambda o: o.shard.k)
    n = check_shard_set(outputs, "selftest")
    first = outputs[0]
    planned = list(first.document["shard"].get("planned") or [])
    for output in outputs[1:]:
        for key in ("tier", "matrix"):
            if output.document.get(key) != first.document.get(key):
                raise MergeError(f"{output.directory / SELFTEST_NAME}: {key} {output.document.get(key)!r}, but "
                                 f"{first.directory / SELFTEST_NAME} has {first.document.get(key)!r}; expected the "
                                 "shards of one self-test (same tier and matrix)")
        if list(output.document["shard"].get("planned") or []) != planned:
            raise MergeError(f"{output.directory / SELFTEST_NAME}: planned other runs than {first.directory / SELFTEST_NAME}; "
                             "expected every shard run with the same matrix and options (--tier, --repeat, --defect, "
                             "--seed, --blackbox)")
    order = {label: index for index, label in enumerate(planned)}
    rows: dict[str, tuple[Row, ShardOutput]] = {}
    for output in outputs:
        for raw in output.document["rows"]:
            label = raw.get("label")
            if label not in order:
                raise MergeError(f"{output.directory / SELFTEST_NAME}: row {label!r} is not in the shard's planned runs")
            if label in rows:
                raise MergeError(f"{output.directory / SELFTEST_NAME}: row {label!r} again (also in "
                                 f"{rows[label][1].directory}); expected each planned run in one shard")
            rows[label] = (_row(raw, output), output)
    missing = [label for label in planned if label not in rows]
    if missing:
        raise MergeError(f"the shards do not cover the plan: {len(missing)} planned run(s) in no shard's "
                         f"{SELFTEST_NAME} ({', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}); expected "
                         "every shard run with the same Ordeal, matrix and options")
    merged_rows = discount_shared_failures([rows[label][0] for label in planned])
    uncovered: list[str] = []
    for output in outputs:
        uncovered += [d for d in output.document.get("uncovered", []) if d not in uncovered]
    checks = [o.document.get("check_s") for o in outputs if o.document.get("check_s") is not None]
    totals = [o.document.get("total_s") for o in outputs if o.document.get("total_s") is not None]
    errors = [(f"shard {o.shard}: " if n > 1 else "") + str(e) for o in outputs for e in o.document.get("errors", [])]
    return SelftestResult(
        tier=str(first.document.get("tier")), rows=merged_rows, uncovered=tuple(uncovered),
        check_s=round(sum(checks), 2) if checks else None, total_s=max(totals) if totals else None, errors=errors,
        shard={"merged": [o.shard.k for o in outputs], "n": n, "planned": planned,
               "sources": [str(o.directory) for o in outputs]})


def _row(raw: dict[str, Any], output: ShardOutput) -> Row:
    missing = [name for name in _ROW_FIELDS if name not in raw and name not in ("witness", "reason", "replay", "need")]
    if missing:
        raise MergeError(f"{output.directory / SELFTEST_NAME}: row {raw.get('label')!r} lacks {', '.join(missing)}; "
                         "expected a row as `ordeal selftest` writes it")
    values = {name: raw[name] for name in _ROW_FIELDS if name in raw}
    for name in _TUPLES:
        values[name] = tuple(values[name])
    values["run_dir"] = _located_run_dir(values["run_dir"], values["label"], output.directory)
    return Row(**values)


def _located_run_dir(run_dir: str | None, label: str, shard_dir: Path) -> str | None:
    """The run directory as stored, or where it is now when the shard's directory was moved (a CI artifact):
    ``<shard dir>/runs/<label>/<run dir name>`` (the self-test's layout)."""
    if not run_dir or Path(run_dir).is_dir():
        return run_dir
    moved = shard_dir / "runs" / label / Path(run_dir).name
    return str(moved) if moved.is_dir() else run_dir


# ------------------------------------------------------------------------------------------------- explore
def merge_explore(outputs: Sequence[ShardOutput], out: Path) -> dict[str, Any]:
    """One summary per scenario over the shards, the corpora copied into ``out/corpus``; the document written to
    ``out/explore/explore-summary.json``."""
    outputs = sorted(outputs, key=lambda o: o.shard.k)
    n = check_shard_set(outputs, "explore")
    corpus_out = out / "corpus"
    copied: dict[Path, Path] = {}  # a shard's corpus entry (resolved) -> its copy
    corpora_done: set[Path] = set()
    notes: list[str] = []
    scenarios: dict[str, dict[int, list[dict[str, Any]]]] = {}
    for output in outputs:
        for exploration in output.document["explorations"]:
            scenario = str(exploration.get("scenario"))
            for run in exploration.get("runs", []):
                if not output.shard.owns_seed(int(run.get("seed", -1))):
                    raise MergeError(f"{output.directory / SUMMARY_NAME}: {scenario} seed {run.get('seed')} is not a "
                                     f"seed of shard {output.shard} (expected seeds s with s % {n} == "
                                     f"{output.shard.k - 1})")
            scenarios.setdefault(scenario, {}).setdefault(output.shard.k, []).append(exploration)
            if exploration.get("corpus") is not None:
                corpus = (output.directory / exploration["corpus"]).resolve()
                if corpus in corpora_done:
                    continue
                corpora_done.add(corpus)
                if corpus.is_dir():
                    copied.update(_copy_corpus(corpus, corpus_out, output.shard))
                else:
                    notes.append(f"shard {output.shard}: corpus {corpus} not found (not copied)")
    by_k = {o.shard.k: o for o in outputs}
    merged = []
    for scenario, shards in scenarios.items():
        runs = []
        codes = []
        for k, explorations in sorted(shards.items()):
            codes += [int(e.get("exit_code", EXIT_UNKNOWN)) for e in explorations]
            for exploration in explorations:
                for run in exploration.get("runs", []):
                    runs.append(run | {"shard": f"{k}/{n}",
                                       "run_dir": _rebase(by_k[k].directory, run.get("run_dir"), out / "explore"),
                                       "entry": _rebase(by_k[k].directory, run.get("entry"), out / "explore", copied)})
        absent = [k for k in range(1, n + 1) if k not in shards]
        if absent:
            codes.append(EXIT_UNKNOWN)
            notes.append(f"{scenario}: shard(s) {', '.join(f'{k}/{n}' for k in absent)} did not explore it: unknown")
        runs.sort(key=lambda r: (r["seed"], r["shard"]))
        exit_code = combine_exit_codes(codes)
        merged.append({
            "scenario": scenario, "shards": sorted(shards), "absent_shards": absent, "exit_code": exit_code,
            "verdict": {EXIT_PASS: "pass", EXIT_FAIL: "fail"}.get(exit_code, "unknown"),
            "seeds": [r["seed"] for r in runs], "runs": runs,
            "failing_entries": [r["entry"] for r in runs if r.get("entry")],
            "stop_reasons": {f"{k}/{n}": [e.get("stop_reason", "") for e in explorations]
                             for k, explorations in sorted(shards.items())},
        })
    exit_code = combine_exit_codes([m["exit_code"] for m in merged])
    document = {"schema_version": EXPLORE_SUMMARY_VERSION, "kind": "explore",
                "shard": {"merged": [o.shard.k for o in outputs], "n": n, "sources": [str(o.directory) for o in outputs]},
                "exit_code": exit_code, "explorations": merged, "notes": notes}
    (out / "explore").mkdir(parents=True, exist_ok=True)
    (out / "explore" / SUMMARY_NAME).write_text(json.dumps(document, indent=2, default=str) + "\n")
    return document


def _rebase(shard_dir: Path, path: str | None, new_base: Path, copied: dict[Path, Path] | None = None) -> str | None:
    """A path relative to a shard's directory, made relative to ``new_base`` (a copied corpus entry: its copy)."""
    if path is None:
        return None
    source = (shard_dir / path).resolve()
    if copied and source in copied:
        source = copied[source]
    return os.path.relpath(source, new_base.resolve())


def _copy_corpus(corpus: Path, corpus_out: Path, shard: Shard) -> dict[Path, Path]:
    corpus_out.mkdir(parents=True, exist_ok=True)
    copied = {}
    for entry in sorted(p for p in corpus.iterdir() if p.is_dir()):
        target = corpus_out / entry.name
        if target.exists():
            target = corpus_out / f"{entry.name}-shard{shard.k}"
        shutil.copytree(entry, target, dirs_exist_ok=True)
        copied[entry.resolve()] = target.resolve()
    for name in ("explored.jsonl", "unknowns.jsonl"):
        if (corpus / name).is_file():
            with (corpus_out / name).open("a") as handle:
                handle.write((corpus / name).read_text())
    return copied


# --------------------------------------------------------------------------------------------------- merge
def merge(directories: Sequence[Path], out: Path) -> MergeResult:
    """Merge every shard output found in ``directories`` into ``out`` (see the module docstring)."""
    outputs = find_outputs(directories)
    out = Path(out)
    kinds = {kind: [o for o in outputs if o.kind == kind] for kind in ("selftest", "explore")}
    for kind, group in kinds.items():  # every error before anything is written
        if group:
            check_shard_set(group, kind)
    out.mkdir(parents=True, exist_ok=True)
    result = MergeResult(exit_code=EXIT_UNKNOWN)
    codes: list[int] = []
    junit = out / "junit"
    record: dict[str, Any] = {"schema_version": MERGE_VERSION}
    if kinds["selftest"]:
        selftest = merge_selftest(kinds["selftest"])
        matrix = _source_only(str(kinds["selftest"][0].document.get("matrix")))
        (out / "selftest").mkdir(parents=True, exist_ok=True)
        write_outputs(selftest, out / "selftest", matrix)
        document = result_document(selftest, matrix)
        result.selftest = selftest
        codes.append(selftest.exit_code)
        shards = selftest.shard or {}
        result.lines += [f"merged selftest shards {_shard_list(shards['merged'], shards['n'])} from "
                         f"{', '.join(shards['sources'])}: {len(selftest.rows)} runs", text_table(document),
                         f"wrote {out / 'selftest' / SELFTEST_NAME} and {out / 'selftest' / 'selftest.html'}"]
        _gather_junit(junit, [out / "selftest" / "selftest-junit.xml"],
                      [Path(r.run_dir) for r in selftest.rows if r.run_dir])
        record["selftest"] = {"shards": shards["merged"], "n": shards["n"], "sources": shards["sources"],
                              "exit_code": selftest.exit_code}
    if kinds["explore"]:
        summary = merge_explore(kinds["explore"], out)
        result.explore = summary
        codes.append(summary["exit_code"])
        shards = summary["shard"]
        result.lines.append(f"merged explore shards {_shard_list(shards['merged'], shards['n'])} from "
                            f"{', '.join(shards['sources'])}")
        for item in summary["explorations"]:
            fails = sum(1 for r in item["runs"] if r["exit_code"] == EXIT_FAIL)
            unknown = sum(1 for r in item["runs"] if r["exit_code"] not in (EXIT_PASS, EXIT_FAIL))
            failed = sorted({i for r in item["runs"] for i in r.get("failing", [])})
            result.lines.append(f"  {item['scenario']}: {len(item['runs'])} runs (seeds {_seed_text(item['seeds'])}), "
                                f"failing {fails}{' (' + ', '.join(failed) + ')' if failed else ''}, unknown "
                                f"{unknown}, exit {item['exit_code']}")
            result.lines += [f"    entry {e}" for e in item["failing_entries"]]
        result.lines += [f"note: {note}" for note in summary["notes"]]
        result.lines.append(f"wrote {out / 'explore' / SUMMARY_NAME}"
                            + (f" and {out / 'corpus'}" if (out / "corpus").is_dir() else ""))
        _gather_junit(junit, [], [(o.directory / r["run_dir"]) for o in kinds["explore"]
                                  for e in o.document["explorations"] for r in e.get("runs", []) if r.get("run_dir")])
        record["explore"] = {"shards": shards["merged"], "n": shards["n"], "sources": shards["sources"],
                             "exit_code": summary["exit_code"]}
    result.exit_code = combine_exit_codes(codes)
    record["exit_code"] = result.exit_code
    (out / MERGE_NAME).write_text(json.dumps(record, indent=2, default=str) + "\n")
    verdict = {EXIT_PASS: "pass", EXIT_FAIL: "fail"}.get(result.exit_code, "unknown")
    result.lines.append(f"merge verdict: {verdict} (exit {result.exit_code}); wrote {out / MERGE_NAME}")
    return result


def _source_only(source: str) -> Matrix:
    """The matrix as the writers need it: its name only (the rows carry their expectations)."""
    return Matrix(source, ())


def _gather_junit(junit: Path, files: Sequence[Path], run_dirs: Sequence[Path]) -> None:
    found = [f for f in files if f.is_file()] + [d / "junit.xml" for d in run_dirs if (d / "junit.xml").is_file()]
    if not found:
        return
    junit.mkdir(parents=True, exist_ok=True)
    for path in found:
        name = path.name if path.name != "junit.xml" else f"{path.parent.name}.xml"
        shutil.copyfile(path, junit / name)


def _shard_list(ks: Sequence[int], n: int) -> str:
    return ", ".join(f"{k}/{n}" for k in ks)


def _seed_text(seeds: Sequence[int]) -> str:
    if not seeds:
        return "none"
    return ", ".join(map(str, seeds)) if len(seeds) <= 12 else f"{seeds[0]} .. {seeds[-1]}"
