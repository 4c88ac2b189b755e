"""The soak scenario, shortened to 3 minutes (benchmarks/soak.py's override of scenarios/soak.toml): the run writes
its resource series (resources.jsonl, harness/resources.py), sampled at the scenario's cadence for the whole
workload, and the harness's resources stay bounded — its RSS after the first minute within 2x its value at one
minute, its open fds not climbing monotonically, the history's parts and bytes growing, the topology's processes
counted apart from the harness.  Figures (RSS flat within 10 %, check time) are the benchmark's, not asserted."""

from __future__ import annotations

import pytest

from benchmarks.soak import SCENARIO, overridden
from harness.resources import RESOURCES_FILE, at, cadence, leak_suspected, read_series

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.nightly]

SHORT_S = 180
RSS_BOUND = 2.0  # generous: the 10 % figure is benchmarks/soak.py's
FD_LEAK_BOUND = 200


@pytest.mark.timeout(1800)  # 3 minutes of workload at 500 msg/s, then a drain of up to 15 minutes
def test_a_three_minute_soak_writes_a_bounded_resource_series_at_its_cadence(tmp_path):
    from harness.run import SilentReporter, run_scenario

    scenario = overridden(SCENARIO, SHORT_S, tmp_path / "scenario")
    result = run_scenario(scenario, 1, tmp_path / "runs", reporter=SilentReporter())
    assert result.summary["error"] is None, result.summary["error"]
    header, samples = read_series(result.run_dir / RESOURCES_FILE)
    assert header["every_s"] == 5.0 and not header.get("sample_errors")

    gaps = cadence(samples)[:-1]  # the last sample is the sampler's stop
    assert len(samples) >= SHORT_S / 5 - 2, len(samples)
    assert all(3.0 <= gap <= 10.0 for gap in gaps), gaps
    workload = samples[-1]["elapsed_s"] - samples[0]["elapsed_s"]
    assert SHORT_S - 10 <= workload <= SHORT_S + 30, workload

    origin = samples[0]["elapsed_s"]
    one_minute = at(samples, origin + 60)
    assert one_minute is not None
    later = [s for s in samples if s["elapsed_s"] >= one_minute["elapsed_s"]]
    assert max(s["harness_rss_bytes"] for s in later) <= RSS_BOUND * one_minute["harness_rss_bytes"]
    assert not leak_suspected([s["harness_fds"] for s in later], FD_LEAK_BOUND)

    assert samples[-1]["history_parts"] > samples[0]["history_parts"]
    assert samples[-1]["history_bytes"] > samples[0]["history_bytes"]
    assert all(s["topology_processes"] >= 6 and s["topology_rss_bytes"] > 0 for s in samples)  # Redis 3+3 at least
    assert all(s["harness_processes"] >= 1 for s in samples)
