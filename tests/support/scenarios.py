"""Scenario texts several test modules build on, and the schema scenario.json is checked against."""

from __future__ import annotations

import json
from pathlib import Path

SCENARIO_SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "docs" / "schemas" / "scenario.schema.json")
                             .read_text())

# The smallest external-target scenario: target keys added after it land in [target].
EXTERNAL = """
[scenario]
name = "x"
duration_s = 10
[target]
kind = "external"
name = "mq"
start = ["mosquitto", "-c", "{run_dir}/m.conf"]
"""
