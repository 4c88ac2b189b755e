"""`ordeal run` / `ordeal plan` / `ordeal scenarios` on bad and good input: exact errors, nothing started."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from ordeal.cli import main


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    return path


def test_run_with_an_invalid_scenario_fails_before_anything_starts(tmp_path: Path):
    bad = _write(tmp_path, "[scenario]\nname = 'x'\nduration_s = 5\n[workload]\npairs = 0\n")
    out = tmp_path / "runs"
    result = CliRunner().invoke(main, ["run", str(bad), "--seed", "1", "--out", str(out)])
    assert result.exit_code == 3  # a load error: neither a violation (1) nor unknown (2)
    assert f"Error: {bad}: [workload] pairs = 0: must be >= 1 and <= 5000" in result.output
    assert not out.exists(), "no run directory for an invalid scenario"


def test_run_with_an_unknown_key_and_a_missing_scenario(tmp_path: Path):
    bad = _write(tmp_path, "[scenario]\nname = 'x'\nduration_s = 5\nduraton_s = 5\n")
    result = CliRunner().invoke(main, ["run", str(bad), "--out", str(tmp_path / "runs")])
    assert result.exit_code == 3 and "[scenario] unknown key 'duraton_s'" in result.output
    result = CliRunner().invoke(main, ["run", "no-such-scenario", "--out", str(tmp_path / "runs")])
    assert result.exit_code == 3 and "no such scenario" in result.output
    assert not (tmp_path / "runs").exists()


def test_plan_prints_the_same_bytes_for_the_same_seed():
    runner = CliRunner()
    first = runner.invoke(main, ["plan", "p2p-smoke", "--seed", "5"])
    again = runner.invoke(main, ["plan", "p2p-smoke", "--seed", "5"])
    other = runner.invoke(main, ["plan", "p2p-smoke", "--seed", "6"])
    assert first.exit_code == 0 and first.output == again.output and first.output != other.output
    assert '"scenario":"p2p-smoke"' in first.output


def test_scenarios_lists_every_shipped_scenario():
    result = CliRunner().invoke(main, ["scenarios"])
    assert result.exit_code == 0
    for name in ("p2p-smoke", "p2p-offline-backlog", "p2p-wraparound", "p2p-limit-trim", "p2p-expiry",
                 "p2p-nightly", "mosquitto-smoke"):
        assert name in result.output


def test_replay_shrink_explore_isolate_by_default_and_can_opt_out():
    for command in ("run", "replay", "shrink", "explore"):
        result = CliRunner().invoke(main, [command, "--help"])
        assert result.exit_code == 0 and "--isolated / --no-isolated" in result.output, (command, result.output)
        assert "[default: isolated]" in " ".join(result.output.split()), command


def test_replay_of_a_stored_run_whose_scenario_is_now_invalid_fails_before_isolating(tmp_path: Path):
    stored = tmp_path / "stored"
    stored.mkdir()
    (stored / "scenario.toml").write_text("[scenario]\nname = 'x'\nduration_s = 5\n[workload]\npairs = 0\n")
    (stored / "plan.json").write_text(CliRunner().invoke(main, ["plan", "p2p-smoke"]).output)
    for command in ("replay", "shrink"):
        result = CliRunner().invoke(main, [command, str(stored), "--out", str(tmp_path / "runs")])
        assert result.exit_code == 3 and "[workload] pairs = 0" in result.output, (command, result.output)
    assert not (tmp_path / "runs").exists()


def test_usage_errors_exit_3_and_help_documents_the_codes():
    """A bad option is a usage error (3), like a scenario that does not load; --help lists every code."""
    result = CliRunner().invoke(main, ["run", "p2p-smoke", "--seed", "not-a-number"])
    assert result.exit_code == 3 and "--seed" in result.output, result.output
    result = CliRunner().invoke(main, ["no-such-command"])
    assert result.exit_code == 3, result.output
    helped = CliRunner().invoke(main, ["--help"])
    assert helped.exit_code == 0
    text = " ".join(helped.output.split())
    assert "0 pass, 1 violation, 2 unknown" in text and "3 usage or load error" in text
