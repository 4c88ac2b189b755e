"""Broken histories are unknown, with the reason, never a pass, found before Spark reads them; pure helpers of
the checkers.  What Spark itself cannot finish: tests/checkers/test_checker_errors.py."""

from __future__ import annotations

import json
from xml.etree import ElementTree as ET

import pyarrow.parquet as pq
import pytest
from support.reports import all_unknown

from contracts.invariants import BY_ID, IDS
from contracts.topics import filter_matches
from spark_checkers import synthetic as s
from spark_checkers.api import check_runs
from spark_checkers.guarantees import NO_LIMIT, Guarantees
from spark_checkers.loader import open_run
from spark_checkers.reports import junit_xml
from spark_checkers.rules.losses import loss_gaps
from spark_checkers.timeline import Timeline
from spark_checkers.verdicts import FAIL, PASS, UNKNOWN, InvariantResult, decide, exit_code

SPEC = s.Spec(pairs=1, messages=5)


def test_truncated_part_is_unknown_without_spark(tmp_path):
    run = s.write_spec(tmp_path / "run", SPEC)
    part = run / "history" / "events-00000.parquet"
    part.write_bytes(part.read_bytes()[: part.stat().st_size // 2])
    all_unknown(check_runs([run]), "events-00000.parquet: not a readable Parquet file")


def test_missing_part_is_unknown(tmp_path):
    run = s.write_spec(tmp_path / "run", SPEC)
    (run / "history" / "events-00001.parquet").unlink()
    all_unknown(check_runs([run]), "listed in the manifest but missing")


def test_missing_column_is_unknown(tmp_path):
    run = s.write_spec(tmp_path / "run", SPEC)
    part = run / "history" / "events-00000.parquet"
    pq.write_table(pq.read_table(part).drop_columns(["dup"]), part)
    all_unknown(check_runs([run]), "missing column(s) ['dup']")


def test_unknown_schema_version_is_unknown(tmp_path):
    run = s.write_spec(tmp_path / "run", SPEC, schema_version=99)
    all_unknown(check_runs([run]), "schema_version 99 is not one this checker knows")


def test_missing_manifest_and_scenario(tmp_path):
    run = s.write_spec(tmp_path / "run", SPEC)
    (run / "scenario.json").unlink()
    all_unknown(check_runs([run]), "scenario.json is missing")
    (run / "history" / "manifest.json").write_text("{not json")
    assert "manifest.json is not valid JSON" in open_run(run).fatal[-1]


def test_row_count_mismatch_is_incomplete(tmp_path):
    run = s.write_spec(tmp_path / "run", SPEC)
    manifest_path = run / "history" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["rows"] += 7
    manifest_path.write_text(json.dumps(manifest))
    assert "the parts hold" in open_run(run).incomplete[0]


@pytest.mark.parametrize("topic_filter,topic,expected", [
    ("europe/ua/kyiv/3/+", "europe/ua/kyiv/3/0", True),
    ("europe/ua/kyiv/3/+", "europe/ua/kyiv/31/0", False),
    ("europe/ua/kyiv/#", "europe/ua/kyiv/3/0", True),
    ("europe/ua/kyiv/#", "europe/ua/kyiv", True),
    ("europe/+/kyiv/+/0", "europe/ua/kyiv/3/0", True),
    ("europe/ua/kyiv/3/+", "europe/ua/kyiv/3", False),
    ("+/x", "$SYS/x", False),
    ("#", "$SYS/x", False),
    ("a/b", "a/b/c", False),
])
def test_topic_filters(topic_filter, topic, expected):
    assert filter_matches(topic_filter, topic) is expected


def test_the_scenario_model_and_the_checker_share_every_default():
    """One source (contracts/invariants.py): a scenario.json without [checks] is judged like a scenario that
    left [checks] out (the checker once fell back to 200 ms while every scenario said 500 ms)."""
    from contracts.scenario import CheckSpec, parse_scenario

    assert Guarantees.from_scenario({}).clock_tolerance_ms == CheckSpec().clock_tolerance_ms == 500
    assert Guarantees.from_scenario({}).pipeline_slack_ms == CheckSpec().pipeline_slack_ms
    scenario = parse_scenario("[scenario]\nname = 'x'\nduration_s = 5\n[broker]\npersisted_messages_limit = 7\n")
    g = Guarantees.from_scenario(scenario.to_dict())
    # The reference broker's own TTL default reaches the checker through scenario.json, not through a copy.
    from reference_broker.config import BrokerConfig

    assert (g.persisted_messages_limit, g.persisted_message_ttl_s) == (7, BrokerConfig().persisted_message_ttl_s)
    assert scenario.to_dict()["broker"]["persisted_message_ttl_s"] == BrokerConfig().persisted_message_ttl_s


def test_guarantees_from_scenario_and_errors():
    g = Guarantees.from_scenario({"broker": {"persisted_messages_limit": 5}, "checks": {"allowed": ["order.dup_flag"]},
                                  "target": {"kind": "reference"}})
    assert (g.persisted_messages_limit, g.persisted_message_ttl_s, g.clock_tolerance_ms) == (5, 604800, 500)
    assert g.allowed == ("order.dup_flag",) and g.white_box and g.queue_policy == "drop_oldest"
    # A black box promises only what it declares: no reference limit or TTL applies to it.
    bare = Guarantees.from_scenario({"target": {"kind": "external"}})
    assert (bare.queue_policy, bare.persisted_messages_limit, bare.persistence) == ("none", NO_LIMIT, "kill")
    assert bare.to_dict()["promises"]["queue_limit"] is None and bare.to_dict()["promises"]["message_ttl_s"] is None
    declared = Guarantees.from_scenario({"target": {"kind": "external", "name": "mq", "promises": {
        "queue_limit": 100, "queue_policy": "drop_newest", "persistence": "graceful", "message_ttl_s": 60}}})
    assert (declared.persisted_messages_limit, declared.queue_policy, declared.persisted_message_ttl_s) == (
        100, "drop_newest", 60)
    assert declared.unpromised_faults == ("process_kill", "power_loss") and not declared.white_box
    with pytest.raises(ValueError, match=r"broker\.persisted_messages_limit must be between 1 and 65535, got 70000"):
        Guarantees.from_scenario({"broker": {"persisted_messages_limit": 70000}})
    with pytest.raises(ValueError, match=r"checks.allowed: unknown invariant id\(s\) \['no.such'\]"):
        Guarantees.from_scenario({"checks": {"allowed": ["no.such"]}})
    with pytest.raises(ValueError, match="target.kind must be one of"):
        Guarantees.from_scenario({"target": {"kind": "mosquitto"}})


def test_invariant_ids_match_the_architecture_contract():
    from pathlib import Path

    text = (Path(__file__).parents[2] / "docs" / "architecture.md").read_text()
    block = text.split("## Invariant ids")[1].split("```")[1]
    documented = [token for token in block.split() if "." in token and not token.startswith("(")]
    assert sorted(documented) == sorted(IDS)


def test_decide_never_passes_unknown():
    lost, liveness = BY_ID["durability.lost"], BY_ID["liveness.stuck_inflight"]
    kw = dict(allowed=(), fatal=(), incomplete=(), unknown_reason=None, white_box=True)
    assert decide(lost, 0, **kw)[0] == PASS
    assert decide(lost, 3, **kw)[0] == FAIL
    assert decide(lost, 3, **{**kw, "allowed": ("durability.lost",)})[:3:2] == (PASS, True)
    assert decide(lost, 0, **{**kw, "incomplete": ("timeout",)})[0] == UNKNOWN
    assert decide(lost, 2, **{**kw, "incomplete": ("timeout",)})[0] == UNKNOWN
    assert decide(lost, 0, **{**kw, "fatal": ("corrupt",)})[0] == UNKNOWN
    assert decide(liveness, 9, **kw)[0] == PASS
    results = [InvariantResult("a", "a", PASS, 0), InvariantResult("b", "b", UNKNOWN, 0)]
    assert exit_code(results) == 2
    assert exit_code(results + [InvariantResult("c", "c", FAIL, 1)]) == 1
    assert exit_code(results[:1]) == 0 and exit_code([]) == 2


def test_loss_gaps_group_consecutive_messages():
    rows = [{"client": "sub-1", "publisher": "pub-1", "pub_seq": n, "position": "middle", "t_invoke": n}
            for n in (4, 5, 6, 9)]
    gaps = loss_gaps(rows, Timeline("r"))
    assert [(g["first_seq"], g["last_seq"], g["count"]) for g in gaps] == [(4, 6, 3), (9, 9, 1)]


def test_synthetic_packet_ids_wrap_and_trim():
    rows = s.generate(s.Spec(pairs=1, messages=8, first_packet_id=65534, limit=2, offline=(s.Offline(0, 3, 7),)))
    delivered = s.deliveries(rows, "sub-0")
    assert [d["packet_id"] for d in delivered][:3] == [65534, 65535, 1]
    assert [d["pub_seq"] for d in delivered] == [1, 2, 5, 6, 7, 8]  # backlog 3..6 trimmed to the newest 2


def test_junit_has_one_case_per_invariant():
    report = {"invariants": [
        {"id": "durability.lost", "title": "t", "verdict": "fail", "count": 2, "witnesses": [{"text": "w"}]},
        {"id": "meta.history_complete", "title": "t", "verdict": "unknown", "count": 0, "reason": "timeout",
         "witnesses": []},
        {"id": "whitebox.dangling_refs", "title": "t", "verdict": "not_applicable", "count": 0, "witnesses": []},
        {"id": "order.dup_flag", "title": "t", "verdict": "pass", "count": 0, "witnesses": []}],
        "environment": {"check_seconds": 1.5}}
    suite = ET.fromstring(junit_xml(report)).find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped")) == ("4", "1", "1", "1")
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert cases["durability.lost"].find("failure").text == "w"
    assert "timeout" in cases["meta.history_complete"].find("error").get("message")
