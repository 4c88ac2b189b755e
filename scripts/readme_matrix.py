"""Paste the detection matrix of a self-test run into README.md (between the matrix markers).

    .venv/bin/python scripts/readme_matrix.py runs/selftest-full/selftest.json

Takes the defect rows (one per catalog defect: expected invariant, outcome, time to detection) and the
false-alarm figures from ``selftest.json`` as ``ordeal selftest`` wrote it, so the README's table is
generated, never typed.  Exits 1 with the reason when the file or the README markers are missing."""

from __future__ import annotations

import json
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
START = "<!-- detection-matrix:start (scripts/readme_matrix.py) -->"
END = "<!-- detection-matrix:end -->"


def matrix_markdown(document: dict, source: str) -> str:
    lines = [f"Generated from `{source}` (tier {document['tier']}, verdict **{document['verdict']}**, "
             f"exit {document['exit_code']}).", "",
             "| defect | must fail | outcome | detected after (s) |", "|---|---|---|---|"]
    for row in document["rows"]:
        if row["role"] != "defect":
            continue
        detected = "-" if row.get("detection_s") is None else f"{row['detection_s']:.1f}"
        lines.append(f"| `{row['defect']}` | {', '.join(row['expect'])} | {row['outcome']} | {detected} |")
    runs = sum(f["runs"] for f in document["false_alarms"].values())
    violations = sum(f["violations"] for f in document["false_alarms"].values())
    unknown = sum(f["unknown"] for f in document["false_alarms"].values())
    lines += ["", f"Correct broker: **{violations} false alarms in {runs} runs** "
              f"({unknown} unknown) over {len(document['false_alarms'])} scenarios."]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: readme_matrix.py SELFTEST_JSON", file=sys.stderr)
        return 1
    source = Path(argv[0])
    try:
        document = json.loads(source.read_text())
    except (OSError, ValueError) as error:
        print(f"{source}: cannot read a selftest.json ({error})", file=sys.stderr)
        return 1
    text = README.read_text()
    if START not in text or END not in text:
        print(f"{README}: the markers {START!r} and {END!r} are missing", file=sys.stderr)
        return 1
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    README.write_text(f"{head}{START}\n{matrix_markdown(document, source.as_posix())}\n{END}{tail}")
    print(f"{README}: detection matrix updated from {source}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
