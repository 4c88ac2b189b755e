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
