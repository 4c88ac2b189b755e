"""Pure parts of the containers provider: provider gaps, the nft places, run ids, the mirror, the PID map."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from faults.catalog import FAULT_KINDS, PROVIDER_GAPS, provider_supports, unsupported_faults
from faults.network import BRIDGE_PLACE, LOCAL_PLACE, place_of
from harness.containers.images import debian_mirror
from harness.containers.node import outer_pid
from harness.containers.topology import run_id_for
from harness.topology_config import TopologyConfig, TopologyConfigError


def test_every_gap_names_a_real_kind_and_a_reason():
    for provider, gaps in PROVIDER_GAPS.items():
        for kind, reason in gaps.items():
            assert kind in FAULT_KINDS and len(reason) > 20, (provider, kind)
    assert provider_supports("containers", "process_kill") and not provider_supports("containers", "net_bandwidth")
    assert provider_supports("local", "net_bandwidth")


def test_unsupported_faults_names_fault_provider_and_reason():
    (message,) = unsupported_faults("containers", ["process_kill", "net_bandwidth", "net_bandwidth"])
    assert "'net_bandwidth'" in message and "'containers'" in message and "bridge" in message
    assert unsupported_faults("local", ["net_bandwidth"]) == []  # near miss: the same kind locally


def test_places_local_one_input_chain_containers_three_bridge_hooks():
    assert LOCAL_PLACE.chains("f_x") == [("f_x", "input")]
    assert [hook for _chain, hook in BRIDGE_PLACE.chains("f_x")] == ["forward", "input", "output"]
    assert len({chain for chain, _hook in BRIDGE_PLACE.chains("f_x")}) == 3
    assert place_of(object()) is LOCAL_PLACE

    class Containers:
        network_fault_place = "bridge"

    assert place_of(Containers()) is BRIDGE_PLACE


def test_provider_is_validated_and_s3rver_refused_on_containers():
    assert TopologyConfig.from_mapping({"provider": "containers"}).provider == "containers"
    with pytest.raises(TopologyConfigError, match="provider = 'docker': must be one of 'local', 'containers'"):
        TopologyConfig.from_mapping({"provider": "docker"})
    with pytest.raises(TopologyConfigError, match="no s3rver image"):
        TopologyConfig.from_mapping({"provider": "containers", "kafka_storage": "s3rver"})
    assert TopologyConfig.from_mapping({"provider": "containers"}).resolve_binaries() == {}


def test_run_ids_are_label_safe_and_distinct(tmp_path: Path):
    a, b = run_id_for(tmp_path / "p2p smoke:1"), run_id_for(tmp_path / "other" / "p2p smoke:1")
    assert a != b and all(c.isalnum() or c in "-_." for c in a)


def test_debian_mirror_from_deb822(tmp_path: Path):
    sources = tmp_path / "debian.sources"
    sources.write_text("Types: deb\nURIs: http://mirror.example/debian-security\n\nTypes: deb\n"
                       "URIs: http://mirror.example/debian\nSuites: bookworm\n")
    assert debian_mirror(sources) == "http://mirror.example/debian"
    assert debian_mirror(tmp_path / "missing") == "http://deb.debian.org/debian"


def test_outer_pid_without_a_sandbox_is_the_same_pid():
    assert outer_pid(os.getpid(), None) == os.getpid()
    assert outer_pid(999_999_999, 1) is None  # no process has that PID in a child namespace of init
