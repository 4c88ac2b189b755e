"""The kept topology (harness/local/keeper.py) against real Redis Cluster and Tansu: what a seed leaves behind
(keys, a promoted replica, a paused node, a network rule, a Kafka topic with records and a group's offsets)
is gone after the reset, the node -> role map is the fresh start's, and a reset that cannot be verified
makes the next seed start fresh, with the reason."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from faults.network import heal_all_network
from harness.local.keeper import ResetError, TopologyKeeper, _list_topics, _wait, cluster_layout
from harness.netns import in_private_netns
from harness.topology_config import TopologyConfig

pytestmark = pytest.mark.integration

CONFIG = TopologyConfig(redis_masters=3, redis_replicas_per_master=1, broker_nodes=1)


def broker_config(run_dir):
    def write(topology):
        run_dir.mkdir(parents=True, exist_ok=True)
        path = run_dir / "broker-config.json"
        path.write_text(json.dumps({"redis_startup_nodes": [f"{h}:{p}" for h, p in topology.redis_startup_nodes()],
                                    "kafka_bootstrap": topology.kafka_bootstrap(), "broker": {}}))
        return path
    return write


async def _leave_a_topic(bootstrap: str) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False)
    await producer.start()
    try:
        await (await producer.send("leftover", b"from the last seed", partition=0))
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id="leftover-group", enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign([TopicPartition("leftover", 0)])
        await consumer.commit({TopicPartition("leftover", 0): 1})
    finally:
        await consumer.stop()


def test_a_seeds_leftovers_are_gone_and_roles_restored(tmp_path):
    keeper = TopologyKeeper(tmp_path / "kept", spares=0)  # the reset in line, before release returns
    try:
        seed1 = tmp_path / "seed-1"
        topology = keeper.acquire(CONFIG, seed1, broker_config(seed1))
        fresh = cluster_layout(topology)
        assert keeper.info["kept"] is False and len(topology.brokers) == 1
        # What a seed leaves behind: keys on every master, a topic with a record and a group's offset,
        # a killed master whose replica took over (the killed one restarts as a replica), a paused replica,
        # a network rule.
        for index in range(50):
            topology.redis.master_for_key(f"k{index}").command("SET", f"k{index}", "v")
        asyncio.run(_leave_a_topic(topology.kafka_bootstrap()))
        master = topology.redis_nodes[0]
        replica = topology.redis.replicas_of(master)[0]
        master.kill()
        _wait(time.monotonic() + 60, "the replica's promotion", lambda: replica.is_master())
        master.start()
        _wait(time.monotonic() + 60, "the old master to rejoin as a replica",
                     lambda: master.is_alive() and cluster_layout(topology).get(master.name, ("",))[0] == "replica")
        assert cluster_layout(topology) != fresh
        other = topology.redis_nodes[-1]
        other.pause()
        if in_private_netns():
            import subprocess
            subprocess.run(["nft", "add", "table", "inet", "ordeal"], check=True)
            subprocess.run(["nft", "add", "chain", "inet", "ordeal", "leftover"], check=True)

        released = keeper.release(seed1)
        assert released["verified"] is True and released["problem"] == "", released
        assert cluster_layout(topology) == fresh
        assert all(node.command("DBSIZE") == 0 for node in topology.redis_nodes)
        assert "leftover" not in _list_topics(topology.kafka_bootstrap())
        assert heal_all_network() == [] and not other.paused
        assert topology.brokers == [] and (seed1 / "logs" / f"{master.name}.log").is_file()

        seed2 = tmp_path / "seed-2"
        again = keeper.acquire(CONFIG, seed2, broker_config(seed2))
        assert again is topology and keeper.info["kept"] is True and keeper.info["seed_on_topology"] == 2
        assert (seed2 / "logs" / "broker-1.log").is_file()
        assert [name for name, _, path in keeper.log_files(seed2)
                if path.parent != seed2 / "logs"] == []  # every node's log of this seed lands in its run dir

        # A reset that cannot be verified: the topology is given up, the next seed starts fresh, with why.
        keeper.current.verify = lambda: (_ for _ in ()).throw(ResetError("keys left: planted"))
        released = keeper.release(seed2)
        assert released["verified"] is False and "keys left: planted" in released["problem"]
        assert keeper.idle == [] and not topology.redis_nodes[0].is_alive()
        seed3 = tmp_path / "seed-3"
        third = keeper.acquire(CONFIG, seed3, broker_config(seed3))
        assert third is not topology and keeper.info["kept"] is False
        assert "keys left: planted" in keeper.info["fresh_because"] and keeper.fresh_starts == 2
        keeper.release(seed3)
    finally:
        keeper.close()


def test_with_a_spare_the_reset_runs_beside_the_next_seed_and_is_verified_before_reuse(tmp_path):
    keeper = TopologyKeeper(tmp_path / "kept", spares=1)
    try:
        runs = [tmp_path / f"seed-{n}" for n in (1, 2, 3)]
        first = keeper.acquire(CONFIG, runs[0], broker_config(runs[0]))
        first.redis.master_for_key("k").command("SET", "k", "v")
        released = keeper.release(runs[0])
        assert released["background"] is True and released["verified"] is None
        second = keeper.acquire(CONFIG, runs[1], broker_config(runs[1]))  # the spare: started fresh, once
        assert second is not first and keeper.info["kept"] is False and keeper.fresh_starts == 2
        keeper.release(runs[1])
        third = keeper.acquire(CONFIG, runs[2], broker_config(runs[2]))
        assert third is first and keeper.info["kept"] is True and keeper.info["reset_verified"] is True
        assert third.redis.master_for_key("k").command("EXISTS", "k") == 0  # the first seed's key is gone
        assert keeper.info["brokers"] == "started by the reset before this seed"
        keeper.release(runs[2])
        assert " ready on " in (runs[2] / "logs" / "broker-1.log").read_text()  # its log, in the seed's run dir
    finally:
        keeper.close()
