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


def durable_reference(topology: str = "", broker: str = "") -> str:
    """The [topology], [target] and [broker] tables of a one-node reference run that owes every acknowledged
    message (the durable settings of docs/reference-broker.md: acks from every in-sync replica, WAIT for one Redis
    replica, no failed save or produce skipped); ``topology`` / ``broker``: more keys of those tables."""
    return (f"[topology]\nredis_masters = 3\nredis_replicas_per_master = 1\nbroker_nodes = 1\n{topology}\n"
            "[target]\nkind = \"reference\"\n\n"
            "[broker]\nproducer_acks = \"all\"\nredis_wait_replicas = 1\n"
            "incoming_failure_strategy = \"retry_forever\"\npersisted_failure_strategy = \"retry_forever\"\n"
            f"{broker}\n")
