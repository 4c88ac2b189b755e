"""Clock faults on a black-box target: with a clock fault in the plan every node of an external target starts under
libfaketime (harness/external_target.py prepare_clocks), so a jump reaches Mosquitto (a C broker reading the wall
clock through libc): the evidence shows the preload in its process and the offset a probe under its environment
sees, and the history has its clock timeline.  Near miss: the same scenario without the fault starts no node
under the preload."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest

from contracts.history_schema import Kind
from contracts.scenario import find_scenario
from harness.history import read_history
from harness.run import run_scenario

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

FAULTS = """
[faults]
mix = { clock_jump = 1 }
targets = { clock_jump = ["node:mosquitto"] }
params = { clock_jump = { delta_s = 30.0 } }
quiet_s = [2, 3]
duration_s = [2, 3]
tail_s = 2
max_faults = 1

"""


def _scenario(tmp_path: Path, faults: bool) -> Path:
    if shutil.which("mosquitto") is None:
        pytest.fail("mosquitto is not installed (scripts/bootstrap.sh installs it)")
    text = find_scenario("mosquitto-smoke").read_text()
    text = text.replace('name = "mosquitto-smoke"', 'name = "mosquitto-clock"', 1).replace(
        "duration_s = 6\n", "duration_s = 10\n", 1)
    if faults:
        text = text.replace("[checks]\n", FAULTS + "[checks]\n", 1)
    path = tmp_path / f"mosquitto-clock-{faults}.toml"
    path.write_text(text)
    return path


@pytest.fixture
def out_dir():
    """Mosquitto drops root: its data directory's parents must be searchable by its user (pytest's are not)."""
    path = Path(tempfile.mkdtemp(prefix="ordeal-run-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_a_clock_jump_reaches_mosquitto_and_heals(tmp_path, out_dir):
    result = run_scenario(_scenario(tmp_path, True), 1, out_dir, check=False)
    run_dir = result.run_dir
    summary = json.loads((run_dir / "summary.json").read_text())
    assert any("libfaketime" in note for note in summary.get("notes", [])), summary.get("notes")
    rows = read_history(run_dir / "history").to_pylist()
    timeline = [json.loads(r["detail"])["offset_s"] for r in rows
                if r["kind"] == Kind.NODE_EVENT and r["node"] == "mosquitto"
                and json.loads(r["detail"] or "{}").get("action") == "clock"]
    assert timeline == [30.0, 0.0]
    evidence = [json.loads(r["detail"]) for r in rows if r["kind"] == Kind.FAULT_EVIDENCE]
    assert [e["stage"] for e in evidence] == ["apply", "heal"]
    assert all(r["bit"] for r in rows if r["kind"] == Kind.FAULT_EVIDENCE), evidence
    assert summary["counts"]["acked"] == summary["counts"]["delivered_unique"] > 0


def test_near_miss_without_a_clock_fault_no_node_is_preloaded(tmp_path, out_dir):
    result = run_scenario(_scenario(tmp_path, False), 1, out_dir, check=False)
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert summary["counts"]["acked"] == summary["counts"]["delivered_unique"] > 0, summary.get("error")
    assert not (result.run_dir / "clock").exists()
    assert not any("libfaketime" in note for note in summary.get("notes", []))
