"""The shipped three-node RabbitMQ cluster (Debian's rabbitmq-server 3.10 with its MQTT plugin) as a clustered
black-box target: it forms, clients connect to every node and take their sessions over to other nodes, a
one-node kill bites with evidence and the cluster re-forms after the heal, and a partition of one node from
the other two bites and heals.  Read back from each run's history; the smoke run is also checked (it passes:
docs/findings.md).  A missing rabbitmq-server fails under CI=true (tests/support/capabilities.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.capabilities import missing_capability
from support.clusters import (
    assert_formed_with_clients_on_every_node,
    assert_one_node_kill_bit_healed_and_re_formed,
    failing,
    fault_rows,
    sessions_taken_over,
)
from support.dirs import searchable_tmp

from contracts.exit_codes import EXIT_PASS
from contracts.history_schema import Kind
from contracts.scenario import find_scenario
from harness.history import read_history

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RABBITMQ_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"
NODES = {"rabbit1", "rabbit2", "rabbit3"}


@pytest.fixture(scope="module")
def out():
    if not Path(RABBITMQ_SERVER).exists():
        missing_capability("rabbitmq-server not installed: run scripts/bootstrap.sh (as root it installs Debian's "
                           "rabbitmq-server with apt-get)")
    with searchable_tmp("ordeal-rabbit-cluster-") as base:
        yield base


@pytest.mark.spark
@pytest.mark.timeout(1200)  # three Erlang VMs boot (tens of seconds), the run, then the check on Spark
def test_the_cluster_forms_clients_use_every_node_and_take_sessions_over_across_nodes(out):
    from ordeal.pipeline import run as run_and_check

    result = run_and_check(find_scenario("rabbitmq-cluster-smoke"), 1, out / "smoke", print_table=False)
    rows = read_history(result.run_dir / "history").to_pylist()
    connects = assert_formed_with_clients_on_every_node(result.run_dir, rows, NODES)
    assert sessions_taken_over(connects), f"a session taken over on another node (session present there): {connects}"
    assert result.exit_code == EXIT_PASS, failing(result.run_dir)


@pytest.mark.timeout(1200)
# Nightly for its time (about 70 s): CI forms the cluster and moves sessions across its nodes (the test above);
# the nightly tier also plays rabbitmq-cluster-kill over five seeds (scripts/nightly-clusters.sh).
@pytest.mark.nightly
def test_a_one_node_kill_bites_with_evidence_heals_and_the_cluster_re_forms(out):
    from harness.run import SilentReporter, run_scenario

    result = run_scenario(find_scenario("rabbitmq-cluster-kill"), 1, out / "kill", reporter=SilentReporter(),
                          check=False)
    assert_one_node_kill_bit_healed_and_re_formed(read_history(result.run_dir / "history").to_pylist(), NODES)


@pytest.mark.nightly  # the longest of the three (a 60 s workload): kept out of .ci/run for its time
@pytest.mark.timeout(1200)
def test_a_partition_of_one_node_from_the_other_two_bites_and_heals(out):
    """RabbitMQ 3.10 has been seen to leave the paused node's rabbit application booting for good after the heal
    ("Global hang workaround: global state ... seems broken": docs/findings.md); then the heal's fault_error fails
    this test. That is a finding about the broker, not a flake of the test."""
    from harness.run import SilentReporter, run_scenario

    result = run_scenario(find_scenario("rabbitmq-cluster-partition"), 1, out / "partition",
                          reporter=SilentReporter(), check=False)
    rows = read_history(result.run_dir / "history").to_pylist()
    faults = fault_rows(rows)
    assert not [f for f in faults if f["kind"] == Kind.FAULT_ERROR], faults
    apply, heal = [f for f in faults if f["kind"] == Kind.FAULT_EVIDENCE][:2]
    sides = next(c for c in apply["detail"]["checks"] if c["what"] == "drop rules installed")["observed"]["sides"]
    assert len(sides["a"]) == 1 and len(sides["b"]) == 2 and set(sides["a"]) | set(sides["b"]) == NODES, sides
    assert apply["bit"], apply
    dropped = next(c for c in heal["detail"]["checks"] if c["what"] == "packets dropped")
    assert heal["bit"] and dropped["observed"]["packets"] > 0, heal
    drain = next(json.loads(r["detail"]) for r in rows if r["kind"] == Kind.PHASE
                 and json.loads(r["detail"] or "{}").get("phase") == "drain_end")
    assert drain["reason"] == "quiet", drain
