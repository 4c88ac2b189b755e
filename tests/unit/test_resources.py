"""harness/resources.py: the resource sampler on the current process (resources.jsonl, its cadence, what a
sample holds), the boundedness rules benchmarks/soak.py and the soak test apply (a growing series fails, a
flat one with noise passes), the [scenario] resource_sample_s key, and the soak scenario's short override."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest

import harness.model  # noqa: F401  (registers the stages into the scenario model)
from contracts.scenario import DEFAULT_RESOURCE_SAMPLE_S, ScenarioError, load_scenario, parse_scenario
from harness.resources import (
    RESOURCES_FILE,
    ResourceSampler,
    cadence,
    descendants,
    flat_within,
    history_usage,
    leak_suspected,
    max_min_ratio,
    process_table,
    read_series,
    take_sample,
)

REPO = Path(__file__).resolve().parents[2]
MINIMAL = '[scenario]\nname = "x"\nduration_s = 1\n{extra}\n[target]\nkind = "reference"\n'


def test_a_sample_of_this_process_reads_its_rss_fds_threads_and_the_history_parts(tmp_path):
    history = tmp_path / "history"
    history.mkdir()
    (history / "events-00000.parquet").write_bytes(b"x" * 1000)
    (history / "events-00001.parquet").write_bytes(b"y" * 500)
    (history / "manifest.json").write_text("{}")
    with open(os.devnull) as _held:  # noqa: F841 - one more fd of this process while sampled
        sample = take_sample(tmp_path, time.monotonic() - 2.0, [])
    assert sample["harness_rss_bytes"] > 10 * 2**20  # a Python process with pyarrow loaded
    assert sample["harness_fds"] >= 4 and sample["harness_threads"] >= 1
    assert sample["history_parts"] == 2 and sample["history_bytes"] == 1502
    assert 2.0 <= sample["elapsed_s"] < 10
    assert sample["topology_processes"] == 0 and sample["topology_rss_bytes"] == 0


def test_the_topology_nodes_and_their_children_are_not_counted_as_the_harness():
    table = {1: (0, 100), 10: (1, 1000), 11: (10, 50), 12: (10, 70), 13: (12, 5), 20: (1, 3000)}
    assert descendants(table, [12]) == {12, 13}
    assert descendants(table, [10]) - descendants(table, [12]) == {10, 11}
    assert descendants(table, [99]) == set()  # a node that has exited
    real = process_table()
    assert os.getpid() in real and real[os.getpid()][0] == os.getppid()


def test_the_sampler_writes_a_header_and_samples_at_its_cadence_then_one_last_on_stop(tmp_path):
    sampler = ResourceSampler(tmp_path, 0.2).start()
    time.sleep(1.1)
    sampler.stop()
    sampler.stop()  # idempotent
    header, samples = read_series(tmp_path / RESOURCES_FILE)
    assert header["every_s"] == 0.2 and header["pid"] == os.getpid()
    assert sampler.errors == 0 and len(samples) == sampler.samples >= 5
    gaps = cadence(samples)[:-1]  # the last one is stop()'s
    assert gaps and all(0.1 <= gap <= 0.6 for gap in gaps)
    assert [s["elapsed_s"] for s in samples] == sorted(s["elapsed_s"] for s in samples)


def test_a_torn_last_line_is_left_out_of_the_series(tmp_path):
    path = tmp_path / RESOURCES_FILE
    path.write_text('{"schema_version": 1, "every_s": 5}\n{"elapsed_s": 1.0, "harness_fds": 5}\n{"elapsed_s": 6')
    header, samples = read_series(path)
    assert header["every_s"] == 5 and samples == [{"elapsed_s": 1.0, "harness_fds": 5}]


def test_a_series_that_grows_fails_the_flat_and_leak_rules():
    growing_rss = [100e6 * (1 + 0.01 * i) for i in range(60)]  # +1 % per sample: 1.59x over the window
    assert not flat_within(growing_rss, 1.10)
    climbing_fds = [40 + i for i in range(60)]
    assert leak_suspected(climbing_fds, 50)


def test_a_flat_series_with_noise_passes_both_rules():
    noise = random.Random(7)
    flat_rss = [100e6 * (1 + noise.uniform(-0.04, 0.04)) for _ in range(60)]  # within +-4 %: max/min <= 1.09
    assert flat_within(flat_rss, 1.10)
    fds = [40 + noise.choice([-3, 0, 2, 5]) for _ in range(60)]  # sockets come and go
    assert not leak_suspected(fds, 50)
    assert not leak_suspected([40 + i for i in range(30)], 50)  # monotone but within the bound


def test_the_ratio_is_undefined_without_positive_values():
    assert max_min_ratio([]) is None and max_min_ratio([0, 5]) is None
    assert max_min_ratio([2, None, 4]) == 2.0


def test_history_usage_of_a_missing_directory_is_zero(tmp_path):
    assert history_usage(tmp_path / "absent") == (0, 0)


def test_resource_sample_s_defaults_and_is_validated_with_the_key_named():
    assert parse_scenario(MINIMAL.format(extra="")).scenario.resource_sample_s == DEFAULT_RESOURCE_SAMPLE_S
    assert parse_scenario(MINIMAL.format(extra="resource_sample_s = 0")).scenario.resource_sample_s == 0.0
    for bad, says in (("-1", "must be >= 0"), ("0.01", "at least 0.1 seconds"), ('"5"', "finite number")):
        with pytest.raises(ScenarioError, match=rf"\[scenario\] resource_sample_s = .*{says}"):
            parse_scenario(MINIMAL.format(extra=f"resource_sample_s = {bad}"), source="x.toml")


def test_the_soak_scenario_and_its_short_override(tmp_path):
    from benchmarks.soak import overridden

    full = load_scenario(REPO / "scenarios" / "soak.toml")
    assert full.scenario.duration_s == 3600 and full.scenario.tier == "soak"
    assert full.workload.pairs * full.workload.rate_per_publisher >= 500
    short = load_scenario(overridden(REPO / "scenarios" / "soak.toml", 180, tmp_path))
    assert short.scenario.duration_s == 180 and short.name == full.name
    assert short.faults == full.faults and short.workload == full.workload
    assert short.scenario.resource_sample_s == full.scenario.resource_sample_s == 5
    chaos = load_scenario(REPO / "scenarios" / "chaos-mix.toml")
    assert dict(full.faults.mix) == dict(chaos.faults.mix)
    half = load_scenario(overridden(REPO / "scenarios" / "soak.toml", None, tmp_path, pairs=25))
    assert half.scenario.duration_s == 3600 and half.workload.pairs == 25
    assert half.faults == full.faults and half.workload.rate_per_publisher == full.workload.rate_per_publisher


def test_the_topology_pids_are_asked_of_the_topology_at_every_sample():
    from harness.resources import topology_pids

    class Node:
        def __init__(self, pid):
            self.pid = pid

    class Topology:  # contracts.topology.ServiceTopology: nodes() is a method
        def __init__(self):
            self.current = [Node(10), Node(None), Node(11)]

        def nodes(self):
            return self.current

    topology = Topology()
    pids = topology_pids(topology)
    assert pids() == [10, 11]
    topology.current = [Node(12)]  # a node killed and restarted: a new pid
    assert pids() == [12]
    assert topology_pids(None)() == []
