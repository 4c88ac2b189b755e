"""Assertions about checked reports that several test modules share."""

from __future__ import annotations

from spark_checkers.verdicts import UNKNOWN


def all_unknown(reports, needle: str) -> None:
    """The one report is unknown (exit 2) on every invariant, each naming ``needle`` as its reason."""
    report = reports[0]
    assert report["exit_code"] == 2
    assert {i["verdict"] for i in report["invariants"]} == {UNKNOWN}
    assert all(needle in (i["reason"] or "") for i in report["invariants"]), report["invariants"][0]["reason"]
