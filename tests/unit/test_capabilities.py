"""A missing capability skips on a developer's machine and fails under CI=true; the scenario model refuses to
load without the stages' registrations instead of silently accepting anything."""

from __future__ import annotations

import subprocess
import sys

import pytest
from support import capabilities


def test_a_missing_capability_fails_under_ci_and_skips_elsewhere(monkeypatch):
    monkeypatch.setattr(capabilities, "CI", True)
    with pytest.raises(pytest.fail.Exception, match="CI=true and a required capability is missing: no nft"):
        capabilities.missing_capability("no nft")
    monkeypatch.setattr(capabilities, "CI", False)
    with pytest.raises(pytest.skip.Exception, match="no nft"):
        capabilities.missing_capability("no nft")


def test_the_scenario_model_without_registrations_says_what_to_import():
    code = ("from contracts.scenario import parse_scenario\n"
            "parse_scenario(\"[scenario]\\nname='x'\\nduration_s=1\\n[faults]\\nmix={process_kill=1}\\n\")\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "import harness.model before loading" in done.stderr, done.stderr
