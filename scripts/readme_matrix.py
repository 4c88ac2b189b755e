"""Paste the detection matrix of one or more self-test runs into README.md (between the matrix markers).

    .venv/bin/python scripts/readme_matrix.py runs/selftest-full/selftest.json [more selftest.json ...]
    .venv/bin/python scripts/readme_matrix.py      # every part kept in docs/detection-matrix/, in name order

The parts the README's table comes from are kept in docs/detection-matrix/ (each the ``tier``, ``exit_code``,
``verdict``, ``defects`` and ``false_alarms`` of one ``selftest.json``), so the table can be made again from the
tree alone; ``1-earlier-runs.json`` holds the rows of runs whose own files were not kept, read back from the table
they generated.

Takes the per-defect summaries (the shipped scenario, the invariants that must fail, the seeds that caught
it out of those run, the outcome against the entry's need, the median time to detection) and the
false-alarm figures from each ``selftest.json`` as ``ordeal selftest`` wrote it, so the README's table is
generated, never typed.  Several files (e.g. ``ordeal selftest --tier full --defect X`` run per defect
group) are merged: a later file's line for the same defect and scenario replaces an earlier one, and the
correct-broker figures add up.  Exits 1 with the reason when a file or the README markers are missing."""

from __future__ import annotations

import json
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
START = "<!-- detection-matrix:start (scripts/readme_matrix.py) -->"
END = "<!-- detection-matrix:end -->"


def full_entries() -> list[dict]:
    """The full-tier entries of selftest/matrix.toml (defect, scenario, expect)."""
    import tomllib

    matrix = tomllib.loads((README.parent / "selftest" / "matrix.toml").read_text())
    return [e for e in matrix.get("entry", []) if e.get("tier", "full") == "full"]


def merge(documents: list[dict]) -> dict:
    """One document from several: defect lines by (defect, scenario), false-alarm figures summed per
    scenario, the worst exit code."""
    defects: dict[tuple[str, str], dict] = {}
    figures: dict[str, dict[str, int]] = {}
    for document in documents:
        for line in document.get("defects", []):
            defects[(line["defect"], line["scenario"])] = line
        for scenario, f in document["false_alarms"].items():
            total = figures.setdefault(scenario, {"runs": 0, "violations": 0, "unknown": 0})
            for key in total:
                total[key] += f[key]
    exit_code = 1 if any(d["exit_code"] == 1 for d in documents) else max(d["exit_code"] for d in documents)
    return {"tier": "/".join(sorted({d["tier"] for d in documents})), "exit_code": exit_code,
            "verdict": {0: "pass", 1: "fail"}.get(exit_code, "unknown"), "defects": list(defects.values()),
            "false_alarms": figures}


def matrix_markdown(document: dict, source: str) -> str:
    lines = [f"Generated from {source} (tier {document['tier']}, verdict **{document['verdict']}**, "
             f"exit {document['exit_code']}).", "",
             "| defect | shipped scenario | must fail | caught (seeds) | outcome | detected after (s, median) |",
             "|---|---|---|---|---|---|"]
    for line in document["defects"]:
        detected = "-" if line.get("median_detection_s") is None else f"{line['median_detection_s']:.1f}"
        need = f", needs {line['need']}" if line["outcome"] != "caught" else ""
        lines.append(f"| `{line['defect']}` | {Path(line['scenario']).stem} | {', '.join(line['expect'])} | "
                     f"{line['caught']}/{line['runs']}{need} | {line['outcome']} | {detected} |")
    measured = {line["defect"] for line in document["defects"]}
    for entry in document.get("not_run", []):
        if entry["defect"] not in measured:
            lines.append(f"| `{entry['defect']}` | {Path(entry['scenario']).stem} | {', '.join(entry['expect'])} | "
                         f"- | not run | - |")
    runs = sum(f["runs"] for f in document["false_alarms"].values())
    violations = sum(f["violations"] for f in document["false_alarms"].values())
    unknown = sum(f["unknown"] for f in document["false_alarms"].values())
    lines += ["", f"Correct broker over the same scenarios and seeds: **{violations} false alarms in {runs} runs** "
              f"({unknown} unknown) over {len(document['false_alarms'])} scenarios."]
    return "\n".join(lines)


PARTS = README.parent / "docs" / "detection-matrix"


def main(argv: list[str]) -> int:
    if not argv:
        argv = [str(path.relative_to(README.parent)) for path in sorted(PARTS.glob("*.json"))]
    if not argv:
        print(f"usage: readme_matrix.py SELFTEST_JSON [SELFTEST_JSON ...] (no parts in {PARTS} either)",
              file=sys.stderr)
        return 1
    documents = []
    for name in argv:
        source = Path(name)
        try:
            documents.append(json.loads(source.read_text()))
        except (OSError, ValueError) as error:
            print(f"{source}: cannot read a selftest.json ({error})", file=sys.stderr)
            return 1
        if "defects" not in documents[-1]:
            print(f"{source}: no per-defect summaries ('defects'): written by an older ordeal selftest; "
                  "run `ordeal selftest --rejudge --out DIR` on it first", file=sys.stderr)
            return 1
    text = README.read_text()
    if START not in text or END not in text:
        print(f"{README}: the markers {START!r} and {END!r} are missing", file=sys.stderr)
        return 1
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    sources = ", ".join(f"`{Path(a).as_posix()}`" for a in argv)
    merged = merge(documents)
    merged["not_run"] = full_entries()  # the matrix's full entries none of the files ran: listed, never hidden
    README.write_text(f"{head}{START}\n{matrix_markdown(merged, sources)}\n{END}{tail}")
    print(f"{README}: detection matrix updated from {sources}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
