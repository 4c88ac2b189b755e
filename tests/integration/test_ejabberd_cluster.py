"""The shipped three-node ejabberd cluster (Debian's ejabberd 23.01 with its mod_mqtt) as a clustered black-box
target: the formation joins it, clients connect to every node and take their sessions over to other nodes
(the smoke run is also checked, and passes), and a kill of one random node bites with evidence, heals, and the
cluster re-forms.  Read back from each run's history.  A missing ejabberd fails under CI=true
(tests/support/capabilities.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.capabilities import missing_capability
from support.clusters import (
    assert_formed_with_clients_on_every_node,
    assert_one_node_kill_bit_healed_and_re_formed,
    failing,
    node_events,
    sessions_taken_over,
)
from support.dirs import searchable_tmp

from contracts.exit_codes import EXIT_PASS
from contracts.scenario import find_scenario
from harness.history import read_history

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EJABBERD_EBIN = "/usr/lib/x86_64-linux-gnu/ejabberd-23.01"
NODES = {"ejabberd1", "ejabberd2", "ejabberd3"}


@pytest.fixture(scope="module")
def out():
    if not Path(EJABBERD_EBIN).is_dir() or not Path("/usr/bin/erl").exists():
        missing_capability("ejabberd 23.01 not installed: run scripts/bootstrap.sh (as root it installs Debian's "
                           "ejabberd with apt-get)")
    with searchable_tmp("ordeal-ejabberd-cluster-") as base:
        yield base


@pytest.mark.spark
@pytest.mark.timeout(900)  # three Erlang VMs boot (seconds), the joins, the run, then the check on Spark
def test_the_cluster_forms_clients_use_every_node_and_take_sessions_over_across_nodes(out):
    from ordeal.pipeline import run as run_and_check

    result = run_and_check(find_scenario("ejabberd-cluster-smoke"), 1, out / "smoke", print_table=False)
    rows = read_history(result.run_dir / "history").to_pylist()
    connects = assert_formed_with_clients_on_every_node(result.run_dir, rows, NODES)
    events = node_events(rows)
    steps = [detail for _node, action, detail in events if action == "formation_step"]
    assert len(steps) == 2 and all(step["exit"] == 0 and "join_cluster" in step["argv"] for step in steps), steps
    probes = {detail["level"]: detail["ok"] for _node, action, detail in events if action == "protocol_probe"}
    assert probes == {4: True, 5: True}, "mod_mqtt speaks MQTT 3.1.1 and 5"
    assert sessions_taken_over(connects), f"a session taken over on another node (session present there): {connects}"
    assert result.exit_code == EXIT_PASS, failing(result.run_dir)


@pytest.mark.nightly  # CI has RabbitMQ's node kill; this one runs in the nightly tier
@pytest.mark.timeout(900)
def test_a_one_node_kill_bites_with_evidence_heals_and_the_cluster_re_forms(out):
    from harness.run import SilentReporter, run_scenario

    result = run_scenario(find_scenario("ejabberd-cluster-kill"), 1, out / "kill", reporter=SilentReporter(),
                          check=False)
    assert_one_node_kill_bit_healed_and_re_formed(read_history(result.run_dir / "history").to_pylist(), NODES)
