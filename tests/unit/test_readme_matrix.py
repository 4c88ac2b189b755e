"""scripts/readme_matrix.py: the README's detection matrix is generated from selftest.json files."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("readme_matrix", ROOT / "scripts/readme_matrix.py")
readme_matrix = importlib.util.module_from_spec(spec)
spec.loader.exec_module(readme_matrix)


def _line(defect, scenario, caught, runs, outcome, median):
    return {"defect": defect, "scenario": f"scenarios/{scenario}.toml", "expect": ["durability.lost"],
            "caught": caught, "runs": runs, "need": 4, "outcome": outcome, "median_detection_s": median}


DOCUMENT = {
    "tier": "full", "verdict": "fail", "exit_code": 1,
    "defects": [_line("trim_newest", "p2p-limit-trim", 5, 5, "caught", 7.12),
                _line("commit_before_save", "broker-node-kill", 3, 5, "missed", None)],
    "false_alarms": {"a.toml": {"runs": 3, "violations": 1, "unknown": 0},
                     "b.toml": {"runs": 2, "violations": 0, "unknown": 1}},
}


def test_defect_lines_and_false_alarm_totals():
    text = readme_matrix.matrix_markdown(DOCUMENT, "`runs/x/selftest.json`")
    assert "| `trim_newest` | p2p-limit-trim | durability.lost | 5/5 | caught | 7.1 |" in text
    assert "| `commit_before_save` | broker-node-kill | durability.lost | 3/5, needs 4 | missed | - |" in text
    assert "**1 false alarms in 5 runs** (1 unknown) over 2 scenarios" in text


def test_a_defect_no_file_ran_is_listed_as_not_run():
    document = dict(DOCUMENT, not_run=[{"defect": "retry_gives_up", "scenario": "scenarios/x.toml",
                                        "expect": ["durability.lost"]},
                                       {"defect": "trim_newest", "scenario": "scenarios/p2p-limit-trim.toml",
                                        "expect": ["limits.trim_not_oldest"]}])
    text = readme_matrix.matrix_markdown(document, "x")
    assert "| `retry_gives_up` | x | durability.lost | - | not run | - |" in text
    assert text.count("`trim_newest`") == 1  # measured: not listed again
    assert {e["defect"] for e in readme_matrix.full_entries()} >= {"commit_before_save", "retry_gives_up"}


def test_several_files_merge():
    other = {"tier": "full", "verdict": "pass", "exit_code": 0,
             "defects": [_line("commit_before_save", "broker-node-kill", 5, 5, "caught", 20.0)],
             "false_alarms": {"a.toml": {"runs": 5, "violations": 0, "unknown": 0}}}
    merged = readme_matrix.merge([DOCUMENT, other])
    assert [(d["defect"], d["caught"]) for d in merged["defects"]] == [("trim_newest", 5), ("commit_before_save", 5)]
    assert merged["false_alarms"]["a.toml"] == {"runs": 8, "violations": 1, "unknown": 0}
    assert merged["exit_code"] == 1


def test_an_old_selftest_json_is_refused_naming_it(tmp_path, capsys):
    old = tmp_path / "selftest.json"
    old.write_text(json.dumps({"tier": "full", "rows": [], "false_alarms": {}}))
    assert readme_matrix.main([str(old)]) == 1
    assert "no per-defect summaries" in capsys.readouterr().err


def test_readme_has_the_markers():
    text = (ROOT / "README.md").read_text()
    assert text.index(readme_matrix.START) < text.index(readme_matrix.END)
