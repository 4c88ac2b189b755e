"""A whole reference run with Tansu killed (or paused) while an APPLICATION client's offset commit is on its way
(``process_kill`` / ``process_pause`` ``at_commit``, faults/commit_hold.py): the plan makes the run route the
broker -> Kafka link through the harness' proxy (ReferenceTarget.prepare_links), the proxy's hold_requests toxic
holds the first OffsetCommit of an APPLICATION consumer group until Tansu is down, the heal brings Tansu back.
The evidence must say a commit was held, the check must pass (exit 0: nothing acknowledged lost, the duplicates
of a lost commit allowed), and nothing of the run may be left running."""

from __future__ import annotations

import json
import shutil

import pytest
from support.capabilities import missing_capability
from support.scenarios import durable_reference

from contracts.exit_codes import EXIT_PASS
from harness import reaper

pytestmark = [pytest.mark.integration, pytest.mark.spark]

HELD = "an OffsetCommit held in flight when Kafka went down"

RUN_SCENARIO = """\
[scenario]
name = "commit-hold-run"
description = "APPLICATION subscribers under fan-in, Tansu {kind} with an offset commit held in flight"
tier = "smoke"
duration_s = 12
drain_quiet_s = 2
drain_timeout_s = 90

""" + durable_reference(broker='application_clients = [{{ client_id = "test_sub_client_*" }}]\napplication_retries = 0') + """[workload]
pattern = "fan-in"
publishers = 3
subscribers = 3
rate_per_publisher = 10
qos_mix = {{ qos1 = 1 }}
protocol_mix = {{ mqtt311 = 1, mqtt5 = 1 }}

[subscribers]
disconnects_per_minute = 4
abrupt_fraction = 1.0
withhold_acks_s = 1.0
offline_s = [1.5, 3.0]
reconnect_node = "any"

[faults]
mix = {{ {kind} = 1 }}
targets = {{ {kind} = ["kafka"] }}
params = {{ {kind} = {{ at_commit = true, commit_wait_s = 3.0 }} }}
quiet_s = [4, 5]
duration_s = [2, 3]
tail_s = 3
max_faults = 1

[checks]
allowed = ["duplicates.redelivered_after_ack"]
"""


def _require() -> None:
    for binary in ("redis-server",):
        if shutil.which(binary) is None:
            missing_capability(f"{binary} is not installed")


# The pause in the nightly tier (a run of its own, about 60 s): CI kills Kafka under a held commit.
@pytest.mark.parametrize("kind", ["process_kill", pytest.param("process_pause", marks=pytest.mark.nightly)])
def test_kafka_down_with_a_commit_held_in_flight_bites_and_loses_nothing_acknowledged(tmp_path, kind):
    _require()
    from harness.history import read_history
    from ordeal.pipeline import run as run_and_check

    path = tmp_path / "commit-hold-run.toml"
    path.write_text(RUN_SCENARIO.format(kind=kind))
    before = set(reaper.tracked())  # other tests' topologies may still run (module and session fixtures)
    result = run_and_check(path, 1, tmp_path / "runs", print_table=False)
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert any("link broker-kafka routed" in note for note in summary.get("notes", [])), summary.get("notes")
    rows = read_history(result.run_dir / "history").to_pylist()
    evidence = {json.loads(r["detail"])["stage"]: json.loads(r["detail"]) for r in rows
                if r["kind"] == "fault_evidence" and r["fault_kind"] == kind}
    assert set(evidence) == {"apply", "heal"}, [r for r in rows if r["kind"] == "fault_error"]
    checks = {c["what"]: c for c in evidence["apply"]["checks"]}
    held = checks[HELD]
    assert held["ok"] and held["observed"]["held_at_down"] >= 1, held
    assert all(r["group_id"].startswith("application-") and r["api_key"] == 8
               for r in held["observed"]["held_requests"]), held
    assert held["observed"]["toxic_removed"] is True, held
    assert evidence["apply"]["bit"] and evidence["heal"]["bit"], evidence
    down = "port refuses" if kind == "process_kill" else "process stopped (state T)"
    assert checks[down]["ok"], checks
    assert result.exit_code == EXIT_PASS, (summary.get("error"), summary.get("check"), summary.get("verdict"))
    assert not set(reaper.tracked()) - before, set(reaper.tracked()) - before
