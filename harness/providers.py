"""The provider switch: which topology class and which target class a scenario runs on.

A topology provider is where the nodes run: "local" (host processes, harness/local/) or "containers" (the
same parts as containers, harness/containers/).  A target is what is tested: the reference broker on a
provider's topology (harness/reference_target.py) or an external black-box broker (harness/external_target.py,
as a container harness/containers/target.py).  Only this module chooses between them; the providers and the
target kinds do not import each other.
"""

from __future__ import annotations

from pathlib import Path

from contracts.scenario import Scenario
from contracts.topology import ServiceTopology, Target
from harness.history import HistoryRecorder
from harness.reference_target import ReferenceTarget, TopologyLender
from harness.topology_config import TopologyConfig


def topology_class(provider: str) -> type[ServiceTopology]:
    """The topology class of a provider ("local" or "containers", harness/topology_config.py PROVIDERS)."""
    if provider == "containers":
        from harness.containers.topology import ContainerTopology

        return ContainerTopology
    from harness.local.host_topology import LocalTopology

    return LocalTopology


def make_target(scenario: Scenario, run_dir: Path, recorder: HistoryRecorder,
                keeper: TopologyLender | None = None) -> Target:
    """keeper: a harness.local.keeper.TopologyKeeper to take the reference topology from (local provider only)."""
    if scenario.target.kind == "external":
        if scenario.topology.get("provider") == "containers":
            from harness.containers.target import ContainerExternalTarget

            return ContainerExternalTarget(scenario, run_dir, recorder)
        from harness.external_target import ExternalTarget

        return ExternalTarget(scenario, run_dir, recorder)
    config = TopologyConfig.from_mapping(scenario.topology, source=scenario.source)
    return ReferenceTarget(scenario, run_dir, recorder, config, topology_class(config.provider), keeper=keeper)
