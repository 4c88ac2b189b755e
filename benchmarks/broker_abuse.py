"""A well-behaved client's latency with and without a concurrent malformed-input flood, side by side in one
run, against the reference broker on the local topology.

Well-behaved: ``--pairs`` persistent MQTT 3.1.1 subscribers (clean session 0) each with a clean publisher
sending QoS 1 at ``--rate`` msg/s.  The run has two phases of ``--duration`` seconds on the same broker:
  1. quiet: only the well-behaved traffic;
  2. flood: the same traffic while ``--flooders`` separate processes open connection after connection and
     send malformed or abusive input (garbage instead of CONNECT, a property length that lies, a PUBLISH with
     a wildcard topic, a remaining length of 200 MB, a Topic Alias (none is allowed), 5,000 QoS 2 publishes never released (the
     server's Receive Maximum is 100 by default), an over-long topic), each connection until the broker closes it (or
     5 s pass), ``--flood-rounds`` times over; the same input for every broker, however fast it answers.
The flood runs in other processes so that it does not take the GIL from the well-behaved clients' threads.

    .venv/bin/python benchmarks/broker_abuse.py --duration 20
    .venv/bin/python benchmarks/broker_abuse.py --broker-checkout /tmp/old   # the broker code of another checkout
    .venv/bin/python benchmarks/broker_abuse.py --duration 20 --record       # also append to docs/measurements.md

Prints JSON: per phase the end-to-end (publish -> delivery) p50/p99/max of the well-behaved messages, their
count, lost and duplicates, and the flood's connections and packets (and how each ended) and its own CPU seconds.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import socket
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import record  # noqa: E402
from benchmarks.broker_p2p import broker_setting, cpu_seconds, percentile, process_tree  # noqa: E402
from benchmarks.s3_requests import log_size, window  # noqa: E402
from harness.local.host_topology import LocalTopology  # noqa: E402
from harness.node import ProcessNode  # noqa: E402
from harness.recording_client import Probe  # noqa: E402
from harness.topology_config import TopologyConfig  # noqa: E402
from reference_broker import codec  # noqa: E402

PAYLOAD_SIZE = 62
QOS2_FLOOD = 5000  # QoS 2 PUBLISHes without PUBREL on one connection (the server's default Receive Maximum is 100)


# ------------------------------------------------------------------ the flood (runs in other processes)
def _connect_v5(client_id: str) -> bytes:
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties
    return codec.encode(codec.Connect(5, client_id, True, 30, Properties(PacketTypes.CONNECT)), 5)


def _publish_v5(topic: str, payload: bytes, qos: int, pid: int | None, retain: bool = False,
                topic_alias: int | None = None) -> bytes:
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties
    properties = Properties(PacketTypes.PUBLISH)
    if topic_alias is not None:
        properties.TopicAlias = topic_alias
    return codec.encode(codec.Publish(topic, payload, qos, retain, False, pid, properties), 5)


_QOS2_BLOB: list[bytes] = []


def abusive_inputs(index: int) -> list[tuple[str, list[bytes]]]:
    """(kind, packets) of one flood connection; ``index`` makes client ids unique."""
    cid = f"flood-{index}"
    if not _QOS2_BLOB:  # built once per process: encoding 5,000 packets each time would load the CPU we measure
        _QOS2_BLOB.append(b"".join(_publish_v5("abuse/q2", b"x" * 40, 2, pid) for pid in range(1, QOS2_FLOOD + 1)))
    connect = _connect_v5(cid)
    bad_props_connect = bytearray(_connect_v5(cid))
    bad_props_connect[12] = 1  # property length 1, but no property follows within it: 0 real bytes
    lying = bytearray(_publish_v5("abuse/x", b"p", 0, None))
    lying[-2] = 9  # property length 9 in a packet that has 1 byte left
    return [
        ("garbage", [b"\xff\xff\xff\xff\xff\xff\xff\xff"]),
        ("connect_bad_property_length", [bytes(bad_props_connect)]),
        ("publish_bad_property_length", [connect, bytes(lying)]),
        ("publish_wildcard_topic", [connect, _publish_v5("abuse/#", b"x" * 40, 1, 1)]),
        ("remaining_length_200MB", [connect, bytes([0x30, 0x80, 0x80, 0x80, 0x64])]),
        # Topic Alias Maximum 0 is declared: an alias is a protocol error (DISCONNECT 0x94) [MQTT-3.3.2-9].
        ("publish_topic_alias", [connect, _publish_v5("abuse/a", b"x" * 40, 1, 1, topic_alias=1)]),
        ("topic_too_long", [connect, _publish_v5("a" * 5000, b"x", 1, 1)]),
        ("qos2_never_released", [connect, _QOS2_BLOB[0]]),
    ]


def flood_worker(host: str, port: int, worker: int, rounds: int, queue) -> None:
    """``rounds`` times every abusive input, each on a connection of its own, one after the other (the
    well-behaved phase lasts until every worker is done).  Reports its own CPU time too: the flood shares the
    broker's cores here, and its share tells whether it starved the rest."""
    counts: dict[str, int] = {}
    packets = connections = 0
    started = time.monotonic()
    kinds = len(abusive_inputs(0))
    for n in range(rounds * kinds):
        kind, sent = abusive_inputs(worker * 1_000_000 + n)[n % kinds]
        try:
            sock = socket.create_connection((host, port), timeout=5)
        except OSError:
            counts["connect_failed"] = counts.get("connect_failed", 0) + 1
            time.sleep(0.05)
            continue
        connections += 1
        try:
            for data in sent:
                sock.sendall(data)
            packets += len(sent) if kind != "qos2_never_released" else 1 + QOS2_FLOOD
            sock.settimeout(5)
            outcome = "open after 5 s"
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    outcome = "closed by broker"
                    break
        except TimeoutError:
            outcome = "open after 5 s"
        except OSError as error:
            outcome = f"error {type(error).__name__}"
        finally:
            sock.close()
        key = f"{kind}: {outcome}"
        counts[key] = counts.get(key, 0) + 1
    queue.put({"connections": connections, "packets": packets, "outcomes": counts,
               "seconds": time.monotonic() - started, "cpu_s": time.process_time()})


# ------------------------------------------------------------------ the well-behaved clients
def payload(pair: int, seq: int) -> bytes:
    head = struct.pack("!IQd", pair, seq, time.time())
    return head + b"x" * (PAYLOAD_SIZE - len(head))


def well_behaved_phase(publishers: list[Probe], subscribers: list[Probe], rate: float, duration: float,
                       phase: int, until=lambda: True) -> dict:
    """Publish for ``duration`` seconds and as long as ``until()`` is false (the flood lasts)."""
    for sub in subscribers:
        sub.clear()
    sent = [0] * len(publishers)
    stop_at = time.monotonic() + duration

    def publish_loop(index: int) -> None:
        client = publishers[index].client
        period, next_at, seq = 1.0 / rate, time.monotonic(), 0
        while time.monotonic() < stop_at or not until():
            client.publish(f"europe/ua/kyiv/{index}/0", payload(phase * 1000 + index, seq), 1)
            seq += 1
            sent[index] = seq
            next_at += period
            time.sleep(max(0.0, next_at - time.monotonic()))

    threads = [threading.Thread(target=publish_loop, args=(i,), daemon=True) for i in range(len(publishers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    expected = sum(sent)
    deadline = time.monotonic() + 120
    while sum(len(s.deliveries) for s in subscribers) < expected and time.monotonic() < deadline:
        time.sleep(0.2)
    e2e, unique, duplicates = [], 0, 0
    for sub in subscribers:
        seen = set()
        for delivery in sub.deliveries:
            tag, seq, sent_at = struct.unpack("!IQd", delivery.payload[:20])
            if tag // 1000 != phase:
                continue  # a late message of the previous phase
            if (tag, seq) in seen:
                duplicates += 1
                continue
            seen.add((tag, seq))
            e2e.append(time.time() - sent_at - (time.monotonic() - delivery.at))
        unique += len(seen)
    return {"published": expected, "delivered_unique": unique, "undelivered_after_wait": expected - unique,
            "duplicates": duplicates,
            "e2e_ms_p50": round(percentile(e2e, 0.5) * 1000, 1), "e2e_ms_p99": round(percentile(e2e, 0.99) * 1000, 1),
            "e2e_ms_max": round(max(e2e) * 1000, 1) if e2e else None}


def run(args: argparse.Namespace) -> dict:
    run_dir = Path(tempfile.mkdtemp(prefix="broker-abuse-"))
    topology = LocalTopology(TopologyConfig(kafka_storage=args.kafka_storage), run_dir / "topology")
    topology.start()
    broker: ProcessNode | None = None
    clients: list[Probe] = []
    try:
        config = run_dir / "broker-config.json"
        settings = {"incoming_partitions": 4, "persisted_partitions": 4, **dict(args.setting)}
        config.write_text(json.dumps({"broker": settings,
                                      "redis_startup_nodes": [f"{h}:{p}" for h, p in topology.redis_startup_nodes()],
                                      "kafka_bootstrap": topology.kafka_bootstrap()}))
        host, port = topology.addresses.allocate(1883)
        checkout = Path(args.broker_checkout).resolve() if args.broker_checkout else Path.cwd()
        broker = ProcessNode("broker-1", "broker", host, port,
                             [sys.executable, "-m", "reference_broker", "--config", str(config), "--node-id",
                              "broker-1", "--listen", f"{host}:{port}"],
                             log_path=run_dir / "broker-1.log", data_dir=run_dir / "broker-1", cwd=checkout)
        broker.start()
        broker.wait_ready(60)
        subscribers, publishers = [], []
        for i in range(args.pairs):
            sub = Probe(host, port, f"test_sub_client_{i}_0", version=4)
            sub.connect(clean=False)
            sub.subscribe(f"europe/ua/kyiv/{i}/+", 1)
            pub = Probe(host, port, f"test_pub_client_{i}_0", version=4)
            pub.connect(clean=True)
            subscribers.append(sub)
            publishers.append(pub)
        clients = subscribers + publishers
        time.sleep(1.0)
        broker_procs = process_tree([broker.pid])
        per_node = {n.name: process_tree([n.pid]) for n in [*topology.nodes(), broker] if n.pid}
        s3_log = run_dir / "topology" / "logs" / "s3.log"
        cpu0 = cpu_seconds(broker_procs)
        node_cpu0 = {name: cpu_seconds(procs) for name, procs in per_node.items()}
        s3_start = log_size(s3_log)
        quiet = well_behaved_phase(publishers, subscribers, args.rate, args.duration, 1)
        quiet.update(window(s3_log, s3_start, quiet["published"]))
        quiet["broker_cpu_s"] = round(cpu_seconds(broker_procs) - cpu0, 1)
        quiet["cpu_s_by_node"] = {name: round(cpu_seconds(procs) - node_cpu0[name], 1)
                                  for name, procs in per_node.items()}

        context = multiprocessing.get_context("spawn")
        queue = context.Queue()
        workers = [context.Process(target=flood_worker, args=(host, port, w, args.flood_rounds, queue), daemon=True)
                   for w in range(args.flooders)]
        cpu0 = cpu_seconds(broker_procs)
        node_cpu0 = {name: cpu_seconds(procs) for name, procs in per_node.items()}
        flood_started = time.monotonic()
        s3_start = log_size(s3_log)
        for worker in workers:
            worker.start()
        flood = well_behaved_phase(publishers, subscribers, args.rate, args.duration, 2,
                                   until=lambda: not any(w.is_alive() for w in workers))
        flood["broker_cpu_s"] = round(cpu_seconds(broker_procs) - cpu0, 1)
        flood["cpu_s_by_node"] = {name: round(cpu_seconds(procs) - node_cpu0[name], 1)
                                  for name, procs in per_node.items()}
        flood["phase_s"] = round(time.monotonic() - flood_started, 1)
        flood.update(window(s3_log, s3_start, flood["published"]))
        reports = [queue.get(timeout=600) for _ in workers]
        for worker in workers:
            worker.join(10)
            if worker.is_alive():
                worker.kill()
        outcomes: dict[str, int] = {}
        for report in reports:
            for key, value in report["outcomes"].items():
                outcomes[key] = outcomes.get(key, 0) + value
        flood["flood"] = {"processes": args.flooders, "rounds": args.flood_rounds,
                          "seconds": round(max(r["seconds"] for r in reports), 1),
                          "connections": sum(r["connections"] for r in reports),
                          "packets": sum(r["packets"] for r in reports), "outcomes": dict(sorted(outcomes.items())),
                          "cpu_s": round(sum(r["cpu_s"] for r in reports), 1)}
        alive = broker.is_alive()
        return {"pairs": args.pairs, "rate_per_publisher": args.rate, "duration_s": args.duration,
                "kafka_storage": args.kafka_storage, "broker_checkout": str(checkout), "settings": settings,
                "quiet": quiet, "with_flood": flood, "broker_alive_after": alive, "run_dir": str(run_dir)}
    finally:
        for client in clients:
            try:
                client.disconnect()
            except Exception:  # noqa: BLE001 - teardown goes on
                pass
        if broker is not None:
            broker.stop(15)
        topology.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--rate", type=float, default=10.0, help="well-behaved messages per second per publisher")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of each phase")
    parser.add_argument("--flooders", type=int, default=4, help="flood processes")
    parser.add_argument("--flood-rounds", type=int, default=3,
                        help="rounds over the abusive inputs per flood process (same input for every broker)")
    parser.add_argument("--kafka-storage", default="s3", choices=["s3", "s3rver", "moto", "memory"])
    parser.add_argument("--broker-checkout", default=None,
                        help="run the broker (python -m reference_broker) from this checkout instead of this one")
    parser.add_argument("--setting", action="append", default=[], type=broker_setting, metavar="KEY=VALUE",
                        help="a broker setting (JSON value), e.g. --setting max_pending_publishes=32")
    parser.add_argument("--record", action="store_true",
                        help="also append the figures to docs/measurements.md (benchmarks/record.py)")
    args = parser.parse_args(argv)
    if args.pairs < 1 or args.flooders < 1 or args.rate <= 0 or args.duration <= 0:
        parser.error("--pairs, --flooders, --rate and --duration must be positive")
    result = run(args)
    print(json.dumps(result, indent=2))
    if args.record:
        record.append("benchmarks/broker_abuse.py", record.command_line(__file__, argv),
                      record.figures(result, drop=("run_dir",)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
