"""The smoke tier's regression list: corpus entries promoted with `ordeal explore --promote ENTRY` live in
tests/data/regressions/<entry>/ (scenario.toml, plan.json, expect.json).  Each is replayed as is (the stored
plan, not a re-plan, so generator changes cannot move it) and must end as expect.json says: "fail" with
the same failing invariants (a planted defect the suite must keep catching) or "pass" (a fixed bug)."""

from __future__ import annotations

import json

import pytest

from ordeal.explore import REGRESSIONS_DIR
from ordeal.replay import load_stored_run, play

pytestmark = pytest.mark.integration

ENTRIES = sorted(p for p in REGRESSIONS_DIR.glob("*") if (p / "expect.json").is_file()) \
    if REGRESSIONS_DIR.is_dir() else []


@pytest.mark.parametrize("entry", ENTRIES, ids=[p.name for p in ENTRIES])
def test_promoted_entry(entry, tmp_path):
    expect = json.loads((entry / "expect.json").read_text())
    stored = load_stored_run(entry)
    played = play(stored.scenario_path, stored.plan, tmp_path)
    if expect["expect"] == "fail":
        assert played.exit_code == 1 and set(expect["invariants"]) <= played.failing, played.run_dir
    else:
        assert played.exit_code == 0, played.run_dir
