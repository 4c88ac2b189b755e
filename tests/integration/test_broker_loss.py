"""Message-loss bugs of the reference broker found by chaos runs, each reproduced deterministically.

A Redis failover that leaves the old master alive as a replica: with ``redis_wait_replicas`` the save
goes through a raw EVALSHA+WAIT pipeline to the key's master, which bypasses RedisCluster's own MOVED
handling.  The broker used to retry on the stale slot map forever (``MovedError; retrying`` once a
second), saving nothing more.  A graceful ``CLUSTER FAILOVER`` reproduces it every time: no connection
breaks, so only MOVED can tell the broker that the slot moved.  The subscriber is offline meanwhile: a
connected one's delivery reads go through RedisCluster, whose MOVED handling patches that very slot and
hides the bug (which is why test_broker_faults' master-kill test, and a node persisting for clients
connected to itself, never showed it)."""

from __future__ import annotations

import time

import pytest
import test_broker_flow
from test_broker_faults import DURABLE, Publisher, drain

pytestmark = pytest.mark.integration
brokers = test_broker_flow.brokers  # the fixture, shared with the flow tests


def _wait_for_role(node, role: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if node.command("ROLE")[0] == role:
                return
        except Exception:  # noqa: BLE001 - the node is switching roles: ask again
            pass
        time.sleep(0.1)
    raise AssertionError(f"redis {node.host}:{node.port} did not become {role} within {timeout} s")


def test_redis_failover_with_old_master_alive_broker_keeps_saving(brokers, topology):
    cluster = brokers(redis_wait_replicas=1, redis_wait_timeout_ms=500, **DURABLE)
    sub = cluster.probe(version=5)
    sub.connect(clean=False, session_expiry=3600)
    sub.subscribe(test_broker_flow.FILTER, 1)
    sub.disconnect()                                     # offline: nothing but the save touches its slot
    master = topology.redis.master_for_key(cluster.key(sub.client_id, "messages"))
    replica = topology.redis.replicas_of(master)[0]
    node = cluster.nodes[0]
    publisher = Publisher([(node.host, node.port)], count=180, rate=40)  # 4.5 s, most after the failover
    publisher.start()
    try:
        time.sleep(1.0)
        replica.command("CLUSTER", "FAILOVER")           # graceful: the old master stays up, as a replica
        _wait_for_role(replica, "master")
        _wait_for_role(master, "slave")
        failed_over_at = time.monotonic()
        publisher.join(60)
    finally:
        topology.redis.wait_ready(30)
    assert not publisher.is_alive()
    acked = set(publisher.acked)
    # the broker must go on saving by itself: a reconnecting subscriber's reads would repair the slot map
    # and hide a stuck persister, so count what is stored (on the new master) before anyone reconnects
    messages_key = cluster.key(sub.client_id, "messages")
    deadline = time.monotonic() + 15
    while (stored := int(replica.command("ZCARD", messages_key))) < len(acked) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert stored >= len(acked), f"only {stored} of {len(acked)} acknowledged messages saved after the failover"
    final = drain(cluster, sub.client_id, 0, acked, sub, timeout=20)
    seen = {int(d.payload[1:]) for d in sub.deliveries + final.deliveries}
    lost = acked - seen
    print(f"\nredis failover (old master alive): published {publisher.count}, acked {len(acked)}, "
          f"delivered {len(seen)} unique, lost {len(lost)}, "
          f"failover-to-drained {time.monotonic() - failed_over_at:.1f} s")
    assert len(acked) > 150
    assert lost == set(), f"acknowledged but never delivered: {len(lost)}, first {sorted(lost)[:20]}"
