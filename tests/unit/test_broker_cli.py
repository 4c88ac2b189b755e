"""``ordeal defects`` and ``ordeal broker`` argument/config handling (no network)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from ordeal.cli import main
from reference_broker.defects import CATALOG


def test_defects_lists_every_defect_with_its_invariant():
    result = CliRunner().invoke(main, ["defects"])
    assert result.exit_code == 0, result.output
    for defect in CATALOG.values():
        line = next(line for line in result.output.splitlines() if line.startswith(defect.name + " "))
        assert defect.invariant in line
    listed = json.loads(CliRunner().invoke(main, ["defects", "--json"]).output)
    assert {d["name"] for d in listed} == set(CATALOG)


def test_broker_needs_exactly_one_config_source(tmp_path):
    result = CliRunner().invoke(main, ["broker", "--node-id", "b1", "--listen", "127.0.0.1:1883"])
    assert result.exit_code != 0 and "exactly one of --config" in result.output


def test_broker_scenario_validation_names_file_and_key(tmp_path):
    scenario = tmp_path / "s.toml"
    scenario.write_text("[broker]\npersisted_messages_limit = 70000\n")
    result = CliRunner().invoke(main, ["broker", "--scenario", str(scenario), "--node-id", "b1",
                                       "--listen", "127.0.0.1:1883", "--redis", "127.0.0.1:7000",
                                       "--kafka", "127.0.0.1:9092"])
    assert result.exit_code != 0
    assert "s.toml [broker]: persisted_messages_limit = 70000" in result.output and "1..65535" in result.output


def test_broker_scenario_needs_endpoints(tmp_path):
    scenario = tmp_path / "s.toml"
    scenario.write_text("[broker]\ndefects = [\"trim_newest\"]\n")
    result = CliRunner().invoke(main, ["broker", "--scenario", str(scenario), "--node-id", "b1",
                                       "--listen", "127.0.0.1:1883"])
    assert result.exit_code != 0 and "--redis" in result.output


def test_broker_print_config(tmp_path):
    scenario = tmp_path / "s.toml"
    scenario.write_text("[broker]\ndefects = [\"trim_newest\"]\npersisted_messages_limit = 9\n")
    result = CliRunner().invoke(main, ["broker", "--scenario", str(scenario), "--node-id", "b1",
                                       "--listen", "127.0.0.1:1883", "--redis", "127.0.0.1:7000",
                                       "--kafka", "127.0.0.1:9092", "--print-config"])
    assert result.exit_code == 0, result.output
    config = json.loads(result.output)
    assert config["broker"]["defects"] == ["trim_newest"] and config["broker"]["persisted_messages_limit"] == 9
    assert config["redis_startup_nodes"] == ["127.0.0.1:7000"]


def test_broker_bad_listen_and_missing_file(tmp_path):
    result = CliRunner().invoke(main, ["broker", "--config", str(tmp_path / "nope.json"), "--node-id", "b1",
                                       "--listen", "127.0.0.1:1883"])
    assert result.exit_code != 0 and "no such config file" in result.output
    result = CliRunner().invoke(main, ["broker", "--config", str(tmp_path / "nope.json"), "--node-id", "b1",
                                       "--listen", "nonsense"])
    assert result.exit_code != 0 and "HOST:PORT" in result.output
