"""What ``build.build`` decides before Spark runs: two names with one 64-bit code are refused, and a forced plan
shape gives a history the other shape's session settings.  The jobs themselves: tests/checkers/test_checker_build.py."""

from __future__ import annotations

import pytest


def test_two_names_with_one_code_are_refused(monkeypatch):
    """Two names with the same code would be one client, topic or stream to the checkers: refused, naming both
    (the check's verdicts are then unknown, never a pass)."""
    from spark_checkers.job import codes

    monkeypatch.setattr(codes, "code_of", lambda name: 7)
    with pytest.raises(ValueError, match="'sub-1' and 'sub-2' have the same 64-bit code 7"):
        codes.Names.of(["sub-1", "sub-2"])
    assert codes.Names.of(["sub-1", "sub-1"]).known == {7: "sub-1"}


def test_a_forced_plan_shape_plans_as_a_history_of_that_size():
    """``check_runs(plan=...)`` (the warm-up's) gives a small history the big plan's settings and the other way
    round; an unknown shape is refused before anything runs."""
    from spark_checkers.api import check_runs
    from spark_checkers.job import sizing

    small, big = 1_000, sizing.SMALL_BYTES * 3
    assert sizing.plan_bytes(small, None) == small and sizing.plan_bytes(big, None) == big
    assert sizing.session_settings(sizing.plan_bytes(small, "big"))["spark.sql.adaptive.enabled"] == "true"
    assert sizing.session_settings(sizing.plan_bytes(big, "small"))["spark.sql.adaptive.enabled"] == "false"
    assert sizing.plan_bytes(big, "big") == big and sizing.plan_bytes(small, "small") == small
    with pytest.raises(ValueError, match="plan='huge': expected one of small, big"):
        check_runs([], plan="huge")
