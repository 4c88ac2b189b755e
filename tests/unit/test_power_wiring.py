"""How a plan's power_loss prepares the run (harness/power.py, ReferenceTarget.prepare_power), the redis-all set
selector, and the catalog's refusals for providers and external targets."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

import pytest

from faults.base import FaultNotApplicable
from faults.catalog import (
    DEFAULT_TARGETS,
    LOG_LOSING_KINDS,
    PROVIDER_GAPS,
    build_fault,
    external_refusal,
    validate_spec,
)
from faults.power import PowerLossFault, PowerLossSetFault
from faults.selectors import parse_selector, resolve_nodes
from harness.power import planned_power_loss
from harness.reference_target import ReferenceTarget
from properties.plan import FaultSlot

FAULTS = [FaultSlot(fault_id="a", kind="power_loss", target="redis-all", start_s=1, end_s=2, params={}),
          {"id": "c", "kind": "process_kill"}]


def _target(provider="local", keeper=None, topology=None, fresh=None):
    return SimpleNamespace(keeper=keeper, reuse=None, topology=topology, config=SimpleNamespace(provider=provider),
                           run_dir=Path("/r"), _write_broker_config=None,
                           topology_class=lambda config, run_dir, broker_config: fresh)


def test_plan_decides_the_lazyfs_data_dirs():
    assert planned_power_loss(FAULTS) and not planned_power_loss(FAULTS[1:])
    target = _target(topology=SimpleNamespace(power_roles=(), disk_limits={}))
    assert ReferenceTarget.prepare_power(target, SimpleNamespace(faults=FAULTS[1:])) == []
    assert target.topology.power_roles == ()
    notes = ReferenceTarget.prepare_power(target, SimpleNamespace(faults=FAULTS))
    assert target.topology.power_roles == ("redis",) and "lazyfs mount" in notes[0]


def test_a_kept_topology_is_not_reused_for_a_power_loss_seed():
    fresh = SimpleNamespace(power_roles=(), disk_limits={})
    kept = _target(keeper=object(), fresh=fresh)
    notes = ReferenceTarget.prepare_power(kept, SimpleNamespace(faults=FAULTS))
    assert kept.keeper is None and kept.topology is fresh and fresh.power_roles == ("redis",)
    assert "fresh topology" in notes[0] and kept.reuse["kept"] is False


def test_refused_on_containers_and_with_disk_full():
    with pytest.raises(RuntimeError, match="lazyfs mount.*containers provider's topology has none"):
        ReferenceTarget.prepare_power(_target("containers", topology=SimpleNamespace()), SimpleNamespace(faults=FAULTS))
    both = _target(topology=SimpleNamespace(power_roles=(), disk_limits={"redis": 1 << 26}))
    with pytest.raises(RuntimeError, match="power_loss and disk_full"):
        ReferenceTarget.prepare_power(both, SimpleNamespace(faults=FAULTS))


def test_catalog_entries():
    assert DEFAULT_TARGETS["power_loss"] == ("redis-master-of:{subscriber}",)
    assert "power_loss" in LOG_LOSING_KINDS
    assert "lazyfs" in PROVIDER_GAPS["containers"]["power_loss"] and "power_loss" not in PROVIDER_GAPS["local"]
    assert external_refusal("power_loss", ("node:n1",), [{}], (("n1", "broker", True),)) == ""
    why = external_refusal("power_loss", ("node:n1",), [{}], (("n1", "broker", False),))
    assert "does not keep its data in the directory the harness gives it" in why


def test_redis_all_names_every_redis_node():
    assert str(parse_selector("redis-all")) == "redis-all"
    nodes = [SimpleNamespace(name=f"redis-{i}") for i in (3, 1, 2)]
    topology = SimpleNamespace(redis_nodes=nodes, brokers=[SimpleNamespace(name="broker-1")])
    assert [n.name for n in resolve_nodes(topology, "redis-all", random.Random(1))] == ["redis-1", "redis-2", "redis-3"]
    with pytest.raises(FaultNotApplicable, match="no Redis nodes"):
        resolve_nodes(SimpleNamespace(redis_nodes=[]), "redis-all", random.Random(1))


def test_a_set_power_loss_waits_for_no_promotion():
    single = build_fault(validate_spec({"id": "p", "kind": "power_loss", "target": "redis-random-master"}))
    assert isinstance(single, PowerLossFault) and single.spec.params["wait_promotion"] is True
    whole = build_fault(validate_spec({"id": "p", "kind": "power_loss", "target": "redis-all"}))
    assert isinstance(whole, PowerLossSetFault)
    assert PowerLossFault(whole.spec).spec.params["wait_promotion"] is False
