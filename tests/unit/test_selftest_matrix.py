"""ordeal/selftest/: matrix validation, the jobs of a tier, the derived scenario, judging, exit codes."""

from __future__ import annotations

import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from contracts.exit_codes import EXIT_FAIL, EXIT_UNKNOWN
from contracts.exit_codes import EXIT_PASS as EXIT_OK
from contracts.scenario import parse_scenario
from ordeal.selftest.judging import (
    CAUGHT,
    FINDING,
    MISSED,
    PASSED,
    UNKNOWN,
    VIOLATION,
    defect_summaries,
    detection_time_s,
    false_alarm_figures,
    judge,
    selftest_exit_code,
)
from ordeal.selftest.matrix import MatrixError, load_matrix, parse_matrix
from ordeal.selftest.outputs import junit_xml, markdown, text_table
from ordeal.selftest.page import render_html
from ordeal.selftest.tier import Job, plan_jobs, scenario_with_defect
from reference_broker.defects import CATALOG

ROOT = Path(__file__).resolve().parents[2]
CATALOG_STUB = {"d1": object(), "d2": object()}
IDS = ("order.dup_flag", "durability.lost", "meta.history_complete")


def _doc(**overrides):
    entry = {"defect": "d1", "scenario": "a.toml", "seed": 1, "expect": ["order.dup_flag"], "tier": "smoke"}
    entry.update(overrides)
    return {"entry": [entry]}


def _parse(document):
    return parse_matrix(document, source="m.toml", root=Path("/x"), catalog=CATALOG_STUB, invariant_ids=IDS,
                        check_files=False)


def test_shipped_matrix_covers_the_whole_catalog_with_known_invariants():
    matrix = load_matrix()
    assert matrix.uncovered(CATALOG) == ()
    full = [e for e in matrix.entries if e.tier == "full"]
    assert sorted(e.defect for e in full) == sorted(CATALOG)
    smoke = [e for e in matrix.entries if e.tier == "smoke"]
    assert 1 <= len(smoke) <= 6  # CI runs them on every change: small
    for entry in smoke:
        assert len(entry.seeds) == 1 and entry.scenario.parent.name == "selftest"
    for entry in matrix.entries:
        # the matrix names the catalog's own invariant (it may add more, never replace it)
        assert CATALOG[entry.defect].invariant in entry.expect, entry.defect
    for entry in full:
        # a full-tier entry: a shipped scenario, at least 5 seeds, at least 4 of 5 must catch it
        assert entry.scenario.parent == ROOT / "scenarios", entry.defect
        assert len(entry.seeds) >= 5 and entry.need >= 0.8 * len(entry.seeds), entry.defect


def test_shipped_selftest_scenarios_load_and_take_a_defect():
    for path in sorted((ROOT / "scenarios" / "selftest").glob("*.toml")):
        scenario = parse_scenario(path.read_text(), source=str(path))
        if scenario.to_dict()["target"]["kind"] == "reference":
            derived = parse_scenario(scenario_with_defect(path.read_text(), "trim_newest"), source=str(path))
            assert derived.to_dict()["broker"]["defects"] == ["trim_newest"]


@pytest.mark.parametrize("document, message", [
    ({}, "at least one [[entry]]"),
    ({"entry": [], "extra": {}}, "unknown table(s) extra"),
    (_doc(defect="nope"), "defect = 'nope': not in the catalog"),
    (_doc(seed=-1), "seed = -1: must be >= 0"),
    (_doc(seed=True), "seed = True"),
    (_doc(expect=[]), "expect = []: must be a non-empty list"),
    (_doc(expect=["order.dup"]), "unknown invariant id(s) order.dup"),
    (_doc(tier="nightly"), "tier = 'nightly': must be one of 'smoke', 'full'"),
    (_doc(seeds=[1, 2]), "give either seed = N or seeds = [N, ...] (got both)"),
    ({"entry": [{"defect": "d1", "scenario": "a.toml", "expect": ["order.dup_flag"], "tier": "smoke"}]},
     "give either seed = N or seeds = [N, ...] (got neither)"),
    ({"entry": [{"defect": "d1", "scenario": "a.toml", "seeds": [1, 1], "expect": ["order.dup_flag"],
                 "tier": "smoke"}]},
     "seeds = [1, 1]: must be a non-empty list of distinct whole numbers >= 0"),
    ({"entry": [{"defect": "d1", "scenario": "scenarios/a.toml", "seeds": [1, 2], "need": 3,
                 "expect": ["order.dup_flag"]}]}, "need = 3: must be a whole number from 1 to the number of seeds (2)"),
    (_doc(tier="full"), "scenario = 'a.toml': a full-tier entry must name a shipped scenario (scenarios/*.toml"),
    (_doc(tier="full", scenario="scenarios/selftest/x.toml"), "not a selftest-only one"),
    (_doc(colour="red"), "unknown key 'colour'"),
    ({"entry": [{"scenario": "a.toml", "seed": 1, "expect": ["order.dup_flag"]}]}, "[[entry]] #1 defect is required"),
    ({**_doc(), "false_alarm": {"repeat": 0}}, "[false_alarm] repeat = 0: must be >= 1"),
    ({**_doc(), "blackbox": {"scenarios": "x.toml"}}, "[blackbox] scenarios = 'x.toml'"),
])
def test_bad_matrix_is_rejected_naming_the_key(document, message):
    with pytest.raises(MatrixError) as error:
        _parse(document)
    assert message in str(error.value)
    assert "m.toml" in str(error.value)


def test_second_entry_for_a_defect_and_tier_is_rejected():
    document = {"entry": _doc()["entry"] * 2}
    with pytest.raises(MatrixError, match="second smoke entry"):
        _parse(document)
    # one smoke and one full entry for the same defect are fine
    assert len(_parse({"entry": _doc()["entry"] + _doc(tier="full", scenario="scenarios/a.toml")["entry"]})
               .entries) == 2


def test_default_need_is_four_of_five():
    entry = _parse({"entry": [{"defect": "d1", "scenario": "scenarios/a.toml", "seeds": [1, 2, 3, 4, 5],
                               "expect": ["order.dup_flag"]}]}).entries[0]
    assert (entry.seeds, entry.need, entry.tier) == ((1, 2, 3, 4, 5), 4, "full")


def test_missing_scenario_file_is_named(tmp_path):
    with pytest.raises(MatrixError, match="scenario = 'a.toml': no such file"):
        parse_matrix(_doc(), source="m.toml", root=tmp_path, catalog=CATALOG_STUB, invariant_ids=IDS)


def test_jobs_per_tier():
    document = {"entry": [_doc()["entry"][0],
                          {"defect": "d2", "scenario": "scenarios/a.toml", "seeds": [1, 2], "expect": ["durability.lost"],
                           "tier": "full"}],
                "false_alarm": {"scenarios": ["a.toml", "b.toml"], "repeat": 2, "seed_start": 7},
                "blackbox": {"scenarios": ["m.toml"]}}
    matrix = _parse(document)
    # uncovered: without a full-tier entry (d1 has only a smoke one)
    assert matrix.uncovered({"d1": 1, "d2": 2, "d3": 3}) == ("d1", "d3")
    smoke = plan_jobs(matrix, "smoke")
    assert [(j.role, j.defect, j.seed) for j in smoke] == [("defect", "d1", 1), ("correct", None, 1)]
    full = plan_jobs(matrix, "full")
    # the full tier: the full entries only, every seed, each scenario + seed once with the correct broker
    assert [(j.role, j.defect, j.seed) for j in full][:4] == [
        ("defect", "d2", 1), ("defect", "d2", 2), ("correct", None, 1), ("correct", None, 2)]
    assert [j.role for j in full][4:] == ["false_alarm"] * 4 + ["blackbox"]
    assert full[0].need == 2 and full[0].label == "defect-d2-1"
    assert [j.seed for j in full if j.role == "false_alarm"] == [7, 8, 7, 8]
    assert len({j.label for j in full}) == len(full)  # labels name run directories: unique
    assert [j.role for j in plan_jobs(matrix, "full", repeat=1, blackbox=False)].count("false_alarm") == 2
    assert [j.defect for j in plan_jobs(matrix, "full", defects=("d2",)) if j.role == "defect"] == ["d2", "d2"]
    # a named full-tier defect runs under the default (smoke) tier too, with its correct runs
    assert [(j.role, j.defect) for j in plan_jobs(matrix, "smoke", defects=("d2",))] == [
        ("defect", "d2"), ("defect", "d2"), ("correct", None), ("correct", None)]
    # --seed replaces the seeds (and caps the need)
    only = plan_jobs(matrix, "full", defects=("d2",), seeds=(7,))
    assert [(j.role, j.seed, j.need) for j in only] == [("defect", 7, 1), ("correct", 7, 1)]
    with pytest.raises(MatrixError, match="no entry for defect"):
        plan_jobs(matrix, "full", defects=("d9",))
    with pytest.raises(MatrixError, match="tier 'soak'"):
        plan_jobs(matrix, "soak")


def test_scenario_with_defect_keeps_the_broker_table():
    text = '[scenario]\nname = "x"\n\n[broker]\npersisted_messages_limit = 10\ndefects = ["a"]\n'
    document = tomllib.loads(scenario_with_defect(text, "b"))
    assert document["broker"] == {"persisted_messages_limit": 10, "defects": ["a", "b"]}
    assert tomllib.loads(scenario_with_defect('[scenario]\nname = "x"\n', "b"))["broker"] == {"defects": ["b"]}


def _report(verdicts: dict[str, str], witnesses: dict[str, list] | None = None, verdict: str = "fail"):
    witnesses = witnesses or {}
    return {"verdict": verdict,
            "invariants": [{"id": i, "verdict": v, "why": f"why {i}", "witnesses": witnesses.get(i, [])}
                           for i, v in verdicts.items()]}


DEFECT_JOB = Job("defect", "defect-d1", Path("/x/a.toml"), 1, "d1", ("order.dup_flag",))
CORRECT_JOB = Job("correct", "correct-a-1", Path("/x/a.toml"), 1)


def test_judge_defect_caught_with_detection_time_from_the_earliest_witness():
    report = _report({"order.dup_flag": "fail", "durability.lost": "pass"},
                     {"order.dup_flag": [{"text": "late", "data": {"t": 5_000_000}},
                                         {"text": "early", "data": {"t": 1_250_000}}]})
    row = judge(DEFECT_JOB, report, run_s=9.0, run_dir="/r")
    assert row.outcome == CAUGHT
    assert row.failed == ("order.dup_flag",)
    assert row.detection_s == 1.25
    assert row.witness.startswith("order.dup_flag: late")


def test_judge_defect_missed_or_unknown():
    assert judge(DEFECT_JOB, _report({"order.dup_flag": "pass"}, verdict="pass"), run_s=1, run_dir="/r").outcome \
        == MISSED
    # failing for another reason is not catching it
    other = judge(DEFECT_JOB, _report({"order.dup_flag": "pass", "durability.lost": "fail"}), run_s=1, run_dir="/r")
    assert other.outcome == MISSED and other.failed == ("durability.lost",)
    undecided = judge(DEFECT_JOB, _report({"order.dup_flag": "unknown"}, verdict="unknown"), run_s=1, run_dir="/r")
    assert undecided.outcome == UNKNOWN and "why order.dup_flag" in undecided.reason
    assert judge(DEFECT_JOB, None, run_s=None, run_dir=None, run_error="boom").outcome == UNKNOWN


def test_judge_correct_runs():
    assert judge(CORRECT_JOB, _report({"order.dup_flag": "pass"}, verdict="pass"), run_s=1, run_dir="/r").outcome \
        == PASSED
    violated = judge(CORRECT_JOB, _report({"durability.lost": "fail"}, {"durability.lost": [{"text": "gap"}]}),
                     run_s=1, run_dir="/r")
    assert violated.outcome == VIOLATION and violated.witness == "durability.lost: gap"
    assert judge(CORRECT_JOB, _report({"meta.history_complete": "unknown"}, verdict="unknown"), run_s=1,
                 run_dir="/r").outcome == UNKNOWN
    blackbox = Job("blackbox", "b", Path("/x/m.toml"), 1)
    assert judge(blackbox, _report({"durability.lost": "fail"}), run_s=1, run_dir="/r").outcome == FINDING


def test_detection_time_uses_known_time_keys_only():
    report = _report({"order.dup_flag": "fail"},
                     {"order.dup_flag": [{"data": {"t_invoke": 3_000_000}}, {"data": {"client": "c"}}]})
    assert detection_time_s(report, ["order.dup_flag"]) == 3.0
    assert detection_time_s(report, ["durability.lost"]) is None


def _row(role, outcome):
    return judge(Job(role, "l", Path("/x/a.toml"), 1, "d1" if role == "defect" else None,
                     ("order.dup_flag",) if role == "defect" else ()),
                 {"defect": _report({"order.dup_flag": "fail"}),
                  "miss": _report({"order.dup_flag": "pass"}),
                  "pass": _report({"order.dup_flag": "pass"}, verdict="pass"),
                  "viol": _report({"durability.lost": "fail"}),
                  "unk": _report({"order.dup_flag": "unknown"}, verdict="unknown")}[outcome],
                 run_s=1, run_dir="/r")


def test_exit_code():
    caught, correct = _row("defect", "defect"), _row("correct", "pass")
    assert selftest_exit_code([caught, correct]) == EXIT_OK
    assert selftest_exit_code([caught, correct, _row("blackbox", "viol")]) == EXIT_OK  # findings never decide
    assert selftest_exit_code([_row("defect", "miss"), correct]) == EXIT_FAIL
    assert selftest_exit_code([caught, _row("false_alarm", "viol")]) == EXIT_FAIL
    assert selftest_exit_code([caught, _row("correct", "unk")]) == EXIT_UNKNOWN
    assert selftest_exit_code([caught, correct], uncovered=("d2",)) == EXIT_UNKNOWN
    assert selftest_exit_code([caught, correct], errors=["spark broke"]) == EXIT_UNKNOWN
    assert selftest_exit_code([]) == EXIT_UNKNOWN
    # a definite miss outweighs an unknown
    assert selftest_exit_code([_row("defect", "miss"), _row("correct", "unk")]) == EXIT_FAIL


def test_false_alarm_figures_and_rendering():
    rows = [_row("defect", "defect"), _row("correct", "pass"), _row("false_alarm", "viol"),
            _row("false_alarm", "pass")]
    assert false_alarm_figures(rows) == {"/x/a.toml": {"runs": 3, "violations": 1, "unknown": 0}}
    document = {"tier": "smoke", "matrix": "m.toml", "exit_code": 1, "verdict": "fail", "catalog_size": 2,
                "uncovered": [], "check_s": 1.0, "total_s": 2.0, "errors": [],
                "false_alarms": false_alarm_figures(rows),
                "rows": [r.__dict__ | {"witness": "<b>x</b>"} for r in rows]}
    table = text_table(document)
    assert "correct-broker runs: 3, with a violation: 1" in table
    assert "selftest verdict: fail (exit 1)" in table
    page = render_html(document)
    assert "&lt;b&gt;x&lt;/b&gt;" in page and "<b>x</b>" not in page
    assert page.count("<tr style=") == 4
    md = markdown(document)
    assert md.count("\n| ") == 4 + 1 + 1 and "| /x/a.toml | 3 | 1 | 0 |" in md


def test_junit_has_one_case_per_row_with_failures_and_errors():
    rows = [_row("defect", "defect"), _row("defect", "miss"), _row("correct", "unk"), _row("false_alarm", "viol")]
    document = {"tier": "smoke", "total_s": 3.0, "uncovered": ["d9"],
                "rows": [r.__dict__ | {"expect": list(r.expect)} for r in rows]}
    xml = junit_xml(document)
    assert xml.count("<testcase") == 5
    # errors counts every <error> case: the unknown row and the uncovered defect (the old writer said 1)
    assert 'failures="2"' in xml and 'errors="2"' in xml
    assert "defect d1 not caught by order.dup_flag" in xml
    assert "no matrix entry" in xml


def test_cli_bad_matrix_exits_3_naming_the_file(tmp_path):
    from click.testing import CliRunner

    from ordeal.cli import main

    bad = tmp_path / "bad.toml"
    bad.write_text('[[entry]]\ndefect = "no_such_defect"\nscenario = "x.toml"\nseed = 1\nexpect = ["durability.lost"]\n')
    result = CliRunner().invoke(main, ["selftest", "--matrix", str(bad), "--out", str(tmp_path / "out")])
    assert result.exit_code == 3
    assert f"{bad}: [[entry]] #1" in result.output and "not in the catalog" in result.output
    assert not (tmp_path / "out").exists()


def test_a_catch_the_correct_broker_shares_is_not_a_catch():
    from ordeal.selftest.judging import discount_shared_failures

    caught = _row("defect", "defect")                       # order.dup_flag failed with the defect on
    correct_same = judge(CORRECT_JOB, _report({"order.dup_flag": "fail"}), run_s=1, run_dir="/r")
    correct_other = judge(CORRECT_JOB, _report({"durability.lost": "fail"}), run_s=1, run_dir="/r")
    shared = discount_shared_failures([caught, correct_same])
    assert shared[0].outcome == UNKNOWN and "correct broker fails order.dup_flag" in shared[0].reason
    assert shared[1].outcome == VIOLATION
    assert discount_shared_failures([caught, correct_other])[0].outcome == CAUGHT
    other_seed = judge(Job("correct", "c", Path("/x/a.toml"), 2), _report({"order.dup_flag": "fail"}), run_s=1,
                       run_dir="/r")
    assert discount_shared_failures([caught, other_seed])[0].outcome == CAUGHT


def _seed_row(seed, outcome, need=4, detection=None):
    row = _row("defect", {"caught": "defect", "missed": "miss", "unknown": "unk"}[outcome])
    return replace(row, seed=seed, need=need, detection_s=detection)


def test_a_defect_needs_its_share_of_seeds():
    correct = _row("correct", "pass")
    four = [_seed_row(1, "caught", detection=2.0), _seed_row(2, "caught", detection=4.0), _seed_row(3, "missed"),
            _seed_row(4, "caught", detection=3.0), _seed_row(5, "caught", detection=9.0)]
    [summary] = defect_summaries(four)
    assert (summary["caught"], summary["missed"], summary["runs"], summary["need"], summary["outcome"]) == \
        (4, 1, 5, 4, CAUGHT)
    assert summary["caught_seeds"] == [1, 2, 4, 5] and summary["median_detection_s"] == 3.5
    assert selftest_exit_code([*four, correct]) == EXIT_OK  # 4 of 5 is enough: one miss is no failure
    three = [*four[:4], _seed_row(5, "missed")]
    assert defect_summaries(three)[0]["outcome"] == MISSED
    assert selftest_exit_code([*three, correct]) == EXIT_FAIL
    # 3 caught + 1 unknown could still reach 4: unknown, not missed
    undecided = [*four[:4], _seed_row(5, "unknown")][:3] + [_seed_row(4, "unknown"), _seed_row(5, "caught")]
    assert defect_summaries(undecided)[0]["outcome"] == UNKNOWN
    assert selftest_exit_code([*undecided, correct]) == EXIT_UNKNOWN


def test_rendering_shows_the_per_defect_fraction():
    rows = [_seed_row(1, "caught", detection=2.0), _seed_row(2, "missed"), _row("correct", "pass")]
    document = {"tier": "full", "matrix": "m.toml", "exit_code": 1, "verdict": "fail", "catalog_size": 1,
                "uncovered": [], "check_s": 1.0, "total_s": 2.0, "errors": [],
                "false_alarms": false_alarm_figures(rows), "defects": defect_summaries(rows),
                "rows": [r.__dict__ for r in rows]}
    assert "| d1 | a | order.dup_flag | 1/2 | 4 | missed | 2.00 |" in markdown(document)
    assert "1/2" in text_table(document)
    page = render_html(document)
    assert page.count('<tr class="defect"') == 1 and page.count("<tr style=") == 3


def test_rejudge_from_stored_reports_and_recheck_first(tmp_path, monkeypatch):
    import json

    from ordeal.selftest import runner as selftest

    rows = []
    for seed, verdict in ((1, "fail"), (2, "pass")):
        run_dir = tmp_path / f"run-{seed}"
        run_dir.mkdir()
        (run_dir / "report.json").write_text(json.dumps(_report({"order.dup_flag": verdict}, verdict=verdict)))
        row = replace(judge(DEFECT_JOB, None, run_s=1.0, run_dir=str(run_dir)), seed=seed, need=2)
        rows.append(row.__dict__ | {"scenario": "scenarios/a.toml"})
    (tmp_path / "selftest.json").write_text(json.dumps({"tier": "full", "rows": rows, "uncovered": [],
                                                        "check_s": 1.0, "total_s": 2.0, "errors": []}))
    matrix = _parse(_doc())
    result = selftest.rejudge(tmp_path, matrix)
    assert [r.outcome for r in result.rows] == [CAUGHT, MISSED]
    assert defect_summaries(result.rows)[0]["outcome"] == MISSED  # 1 of 2 caught, 2 needed
    assert json.loads((tmp_path / "selftest.json").read_text())["defects"][0]["caught"] == 1
    checked = []
    monkeypatch.setattr(selftest, "_check_all", lambda run_dirs, spark_master: checked.extend(run_dirs))
    selftest.rejudge(tmp_path, matrix, recheck=True, log=lambda text: None)
    assert checked == [tmp_path / "run-1", tmp_path / "run-2"]


def test_rejudge_takes_the_expectation_from_the_current_matrix(tmp_path):
    """An entry re-pointed at another invariant since the run is judged by the new expectation; its near miss,
    the stored one, would say missed."""
    import json

    from ordeal.selftest import runner as selftest

    run_dir = tmp_path / "run-1"
    run_dir.mkdir()
    (run_dir / "report.json").write_text(json.dumps(_report({"order.dup_flag": "pass", "durability.lost": "fail"},
                                                            verdict="fail")))
    row = replace(judge(DEFECT_JOB, None, run_s=1.0, run_dir=str(run_dir)), need=1)
    stored = json.dumps({"tier": "full", "rows": [row.__dict__ | {"scenario": "scenarios/a.toml"}], "uncovered": [],
                         "check_s": 1.0, "total_s": 2.0, "errors": []})
    (tmp_path / "selftest.json").write_text(stored)
    moved = _parse(_doc(tier="full", scenario="scenarios/a.toml", expect=["durability.lost"]))
    assert [r.outcome for r in selftest.rejudge(tmp_path, moved).rows] == [CAUGHT]
    (tmp_path / "selftest.json").write_text(stored)  # rejudge rewrote it
    kept = _parse(_doc(tier="smoke", expect=["durability.lost"]))  # no full entry: the stored expect stands
    assert [r.outcome for r in selftest.rejudge(tmp_path, kept).rows] == [MISSED]
    (tmp_path / "selftest.json").write_text(stored)
    elsewhere = _parse(_doc(tier="full", scenario="scenarios/b.toml", expect=["durability.lost"]))
    assert [r.outcome for r in selftest.rejudge(tmp_path, elsewhere).rows] == [MISSED]  # moved: the old question
