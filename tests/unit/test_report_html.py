"""report.html is rendered from a Jinja2 template with autoescaping: broker-supplied text cannot inject markup,
and the file stays self-contained and script-free."""

from __future__ import annotations

import re

from spark_checkers.html import render_html

EVIL = "<script>alert('x')</script><img src=x onerror=alert(1)>"


def _report() -> dict:
    return {
        "schema_version": 1, "checker_version": "0.1.0", "run_dir": f"/runs/{EVIL}", "verdict": "fail",
        "exit_code": 1, "summary": {"pass": 1, "fail": 1, "unknown": 0, "not_applicable": 0},
        "invariants": [
            {"id": "durability.phantom", "title": "Delivered but never published", "verdict": "fail", "count": 1,
             "witnesses": [{"text": f"topic europe/{EVIL} delivered a body nobody published", "data": {}}],
             "reason": EVIL, "allowed": False, "reported_only": False, "details": {"positions": {EVIL: 1}}},
            {"id": "order.dup_flag", "title": "DUP", "verdict": "pass", "count": 0, "witnesses": [], "reason": None,
             "allowed": False, "reported_only": False, "details": {}}],
        "history": {"hash_sha256": "ab" * 32, "manifest": {}, "parts": 1, "incomplete": [], "fatal": []},
        "guarantees": {"allowed": [EVIL]}, "counts": {EVIL: 3}, "series": {},
        "faults": [{"fault_id": "f1", "kind": "process_kill", "node": EVIL, "t_start_s": 1.0, "t_heal_s": None,
                    "bit": True, "error": EVIL}],
        "environment": {"spark_master": "local[2]", "check_seconds": 1.2},
    }


def test_broker_supplied_text_is_escaped_everywhere_and_the_page_has_no_script():
    page = render_html(_report())
    assert "<script" not in page.lower() and "<img" not in page.lower()
    assert page.count("&lt;script&gt;") >= 8  # run dir, witness, reason, position, counts, node, error, guarantees
    assert "topic europe/&lt;script&gt;" in page


def test_the_page_is_self_contained():
    page = render_html(_report())
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", page), "no network resource"
    assert "<link" not in page and "@import" not in page
    assert "No violations." not in page and "durability.phantom — fail" in page


def test_an_unknown_report_without_details_or_witnesses_renders():
    report = _report()
    report["verdict"], report["exit_code"] = "unknown", 2
    report["invariants"] = [{"id": "meta.history_complete", "title": "t", "verdict": "unknown", "count": 0,
                             "witnesses": [], "reason": "manifest says schema_version 9"}]
    del report["faults"], report["counts"]
    page = render_html(report)
    assert "meta.history_complete — unknown" in page and "manifest says schema_version 9" in page


CONTEXT = [
    {"seq": 10, "t_s": 0.95, "kind": "connect", "client": "sub-0", "node": "broker-1", "message": None,
     "packet_id": None, "dup": None, "qos": None, "clean_start": False, "session_present": True,
     "note": "MQTT 5, session expiry 3600 s", "witness": None},
    {"seq": None, "t_s": 1.0, "kind": "fault_start", "client": None, "node": "redis-7003", "message": None,
     "packet_id": None, "dup": None, "qos": None, "clean_start": None, "session_present": None,
     "note": "kill of redis-7003 (f1)", "witness": None},
    {"seq": 12, "t_s": 1.1, "kind": "delivery", "client": "sub-0", "node": "broker-1", "message": "pub-0#6",
     "packet_id": 65535, "dup": False, "qos": 1, "clean_start": None, "session_present": None, "note": None,
     "witness": True},
    {"seq": 13, "t_s": 1.2, "kind": "delivery", "client": "sub-0", "node": "broker-1", "message": "pub-0#6",
     "packet_id": 65535, "dup": True, "qos": 1, "clean_start": None, "session_present": None, "note": EVIL,
     "witness": True},
    {"seq": 14, "t_s": 1.3, "kind": "ack", "client": "sub-0", "node": "broker-1", "message": None,
     "packet_id": 65535, "dup": None, "qos": 1, "clean_start": None, "session_present": None, "note": None,
     "witness": None},
]


def _with_context() -> dict:
    report = _report()
    report["invariants"][0]["witnesses"][0]["context"] = CONTEXT
    return report


def test_each_witness_shows_its_context_rows():
    page = render_html(_with_context())
    table = page.split("<table class='ctx'>")[1].split("</table>")[0]
    rows = table.split("<tr")[2:]  # after the header
    assert len(rows) == len(CONTEXT)
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in rows]
    # t, seq, kind, client, node, message, packet id, DUP, QoS, clean start, session present, note
    assert cells[0][:3] == ["0.950", "10", "connect"] and cells[0][9:11] == ["0", "1"]
    assert cells[1][2] == "fault_start" and "kill of redis-7003 (f1)" in cells[1][11] and "class='fault'" in rows[1]
    assert cells[2][5:9] == ["pub-0#6", "65535", "0", "1"] and "class='w'" in rows[2]
    assert cells[3][6:8] == ["65535", "1"] and "&lt;script&gt;" in cells[3][11]
    assert cells[4][2] == "ack" and cells[4][6] == "65535"
    assert "<script" not in page.lower()


def test_a_witness_without_context_has_no_table():
    assert "<table class='ctx'>" not in render_html(_report())


def test_the_page_opens_with_the_failing_invariants_and_the_replay_command():
    page = render_html(_with_context())
    failing = page.index("<section id='failing'>")
    assert failing < page.index("<h2>Verdicts</h2>") and failing < page.index("<h2>What the target promises</h2>")
    head = page[failing:page.index("</section>", failing)]
    assert "durability.phantom" in head and "order.dup_flag" not in head  # only what failed
    assert "1 × Delivered but never published" in head and "delivered a body nobody published" in head
    assert "ordeal replay /runs/&lt;script&gt;" in head


def test_a_passing_page_says_nothing_failed_and_still_gives_the_replay_command():
    report = _report()
    report["verdict"], report["exit_code"] = "pass", 0
    report["invariants"] = report["invariants"][1:]
    page = render_html(report)
    head = page[page.index("<section id='failing'>"):]
    assert "No invariant failed" in head.split("</section>")[0] and "ordeal replay" in head.split("</section>")[0]


def test_the_recorded_replay_command_is_shown_first():
    report = _with_context()
    report["replay"] = "ordeal run scenarios/p2p-smoke.toml --seed 3 --out runs"
    head = render_html(report).split("</section>")[0]
    assert "ordeal run scenarios/p2p-smoke.toml --seed 3 --out runs" in head and "ordeal replay /runs/" in head


# -- the declaration, the statements, what each verdict covers ---------------------------------------------

STATEMENT = "[MQTT-3.3.1-1] The DUP flag MUST be set to 1 by the Client or Server when it re-delivers a PUBLISH"
COVERS = {"acknowledged": 120, "owed": 118}


def _declared(**promises) -> dict:
    from spark_checkers.guarantees import Guarantees

    target = {"kind": "external", "name": "mosquitto", "start": ["mosquitto"], "credentials": {"username": "ordeal", "password": "***"},
              "tls": {"enabled": True}, "nodes": [{"name": "m1"}, {"name": "m2"}],
              "promises": {"mqtt_versions": ["3.1.1", "5"], "persistence": "graceful", "queue_policy": "drop_newest",
                           "queue_limit": 1000, **promises}}
    return Guarantees.from_scenario({"target": target}).to_dict()


def _declaration(page: str) -> dict[str, list[str]]:
    table = page.split("<table class='decl'>")[1].split("</table>")[0]
    rows = [re.findall(r"<td[^>]*>(.*?)</td>", row, re.S) for row in table.split("<tr>")[2:]]
    return {cells[0]: cells[1:] for cells in rows}


def test_the_declaration_is_a_table_of_promises_in_words_with_what_each_changes_in_judging():
    report = _report()
    report["guarantees"] = _declared()
    rows = _declaration(render_html(report))
    assert rows["persistence"][0].startswith("acknowledged messages survive a graceful stop, not a kill")
    assert rows["persistence"][1] == ("messages lost to a process_kill / power_loss of the broker count as "
                                      "durability.lost_allowed, not durability.lost")
    assert rows["queue limit"][0].startswith("1000 messages per session; beyond it the newest are dropped")
    assert "limits.* rules for drop_newest apply" in rows["queue limit"][1]
    assert rows["MQTT versions"][0] == "3.1.1 and 5" and rows["clustered nodes"][0] == "m1, m2"
    assert rows["credentials"][0].startswith("user name and password") and rows["TLS"][0].startswith("every MQTT")
    assert rows["message TTL"] == ["none declared", "a message without an MQTT 5 expiry interval never expires"]
    assert rows["log preset"][0].startswith("mosquitto (")
    assert "{" not in "".join(sum(rows.values(), [])), "words, not a Python dict"


def test_near_miss_a_declaration_without_a_limit_or_with_power_or_kill_persistence_says_so():
    report = _report()
    report["guarantees"] = _declared(persistence="power", queue_policy="none", queue_limit=None)
    rows = _declaration(render_html(report))
    assert rows["persistence"][1] == "every lost acknowledged message is durability.lost"
    report["guarantees"] = _declared(persistence="kill", queue_policy="none", queue_limit=None)
    assert _declaration(render_html(report))["persistence"][1] == (
        "messages lost to a power_loss of the broker count as durability.lost_allowed, not durability.lost")
    assert rows["queue limit"][0] == "none declared (queue_policy = none)"
    assert "not applicable" in rows["queue limit"][1]
    report["guarantees"] = None
    assert "nothing can be judged" in "".join(_declaration(render_html(report))["declaration"])


def test_each_failing_and_unknown_invariant_shows_its_statement_and_what_it_covers():
    report = _report()
    report["invariants"][0].update(statement=STATEMENT, covers=COVERS)
    report["invariants"].append({"id": "meta.history_complete", "title": "t", "verdict": "unknown", "count": 0,
                                 "witnesses": [], "reason": "the drain timed out", "statement": "the drain ends quietly"})
    page = render_html(report)
    head = page[page.index("<section id='failing'>"):page.index("</section>")]
    assert STATEMENT in head and "(of 120 acknowledged, 118 owed)" in head
    phantom = page[page.index("<section id='durability.phantom'>"):]
    assert STATEMENT in phantom.split("</section>")[0] and "of 120 acknowledged, 118 owed judged" in phantom
    unknown = page[page.index("<section id='meta.history_complete'>"):].split("</section>")[0]
    assert "the drain ends quietly" in unknown
    assert "<td>120 acknowledged, 118 owed</td>" in page  # the verdict table's covers column


def test_near_miss_a_passing_invariant_shows_no_statement_and_a_report_without_covers_renders():
    report = _report()
    report["invariants"][1]["statement"] = "a passing rule's statement"
    page = render_html(report)
    assert "a passing rule's statement" not in page
    assert " acknowledged" not in page and " judged;" not in page


def test_junit_and_the_terminal_table_carry_the_statement_and_the_covers():
    import io
    from xml.etree import ElementTree as ET

    from spark_checkers.reports import junit_xml, print_table

    report = _report()
    report["invariants"][0].update(statement=STATEMENT, covers=COVERS)
    case = next(c for c in ET.fromstring(junit_xml(report)).iter("testcase") if c.get("name") == "durability.phantom")
    message = case.find("failure").get("message")
    assert message == f"1 violation(s): Delivered but never published — covers 120 acknowledged, 118 owed — {STATEMENT}"
    assert case.find("failure").text.startswith("topic europe/")  # the body stays the witnesses
    out = io.StringIO()
    print_table(report, file=out)
    text = out.getvalue()
    assert f"durability.phantom: {STATEMENT}" in text and "120 acknowledged" in text
    assert "verdict: fail (exit 1)" in text and "  fail durability.phantom ×1" in text
