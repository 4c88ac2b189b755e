"""scripts/readme_matrix.py: the README's detection matrix is generated from a selftest.json."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("readme_matrix", ROOT / "scripts/readme_matrix.py")
readme_matrix = importlib.util.module_from_spec(spec)
spec.loader.exec_module(readme_matrix)

DOCUMENT = {
    "tier": "full", "verdict": "fail", "exit_code": 1,
    "rows": [
        {"role": "defect", "defect": "trim_newest", "expect": ["limits.trim_not_oldest"], "outcome": "caught",
         "detection_s": 7.12},
        {"role": "defect", "defect": "commit_before_save", "expect": ["durability.lost"], "outcome": "missed",
         "detection_s": None},
        {"role": "correct", "defect": None, "expect": [], "outcome": "violation", "detection_s": 4.0},
    ],
    "false_alarms": {"a.toml": {"runs": 3, "violations": 1, "unknown": 0},
                     "b.toml": {"runs": 2, "violations": 0, "unknown": 1}},
}


def test_defect_rows_and_false_alarm_totals():
    text = readme_matrix.matrix_markdown(DOCUMENT, "runs/x/selftest.json")
    assert "| `trim_newest` | limits.trim_not_oldest | caught | 7.1 |" in text
    assert "| `commit_before_save` | durability.lost | missed | - |" in text
    assert "violation" not in text  # correct-broker rows are summarised, not listed
    assert "**1 false alarms in 5 runs** (1 unknown) over 2 scenarios" in text


def test_readme_has_the_markers():
    text = (ROOT / "README.md").read_text()
    assert text.index(readme_matrix.START) < text.index(readme_matrix.END)
