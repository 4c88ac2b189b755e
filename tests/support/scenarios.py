"""Scenario texts several test modules build on."""

from __future__ import annotations

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
