"""TBMQ's P2P performance pattern at small scale, against the reference broker on the local topology.

N pairs: publisher ``test_pub_client_<i>_0`` publishes QoS 1, 62-byte payloads to ``europe/ua/kyiv/<i>/0``
at ``--rate`` msg/s; subscriber ``test_sub_client_<i>_0`` is a persistent DEVICE client (clean session 0)
on ``europe/ua/kyiv/<i>/+``.  Reports msg/s (in + out, as TBMQ counts), msg/s per CPU core actually used
by the broker + Redis + Kafka (+ S3) processes, p50/p99 end-to-end and PUBACK latency, lost/duplicated
counts, and the broker's top profile entries (cProfile of broker-1).

    .venv/bin/python benchmarks/broker_p2p.py --pairs 20 --rate 20 --duration 20
    .venv/bin/python benchmarks/broker_p2p.py --pairs 20 --rate 20 --duration 15 --no-profile --record

``--record`` also appends the figures to docs/measurements.md (benchmarks/record.py).

TBMQ's anchor: ~8,900 msg/s per CPU core over the whole setup (docs/tbmq-notes.md).
"""

from __future__ import annotations

import argparse
import json
import pstats
import statistics
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import record  # noqa: E402
from benchmarks.s3_requests import log_size, window  # noqa: E402
from harness.local.host_topology import LocalTopology  # noqa: E402
from harness.node import ProcessNode  # noqa: E402
from harness.recording_client import Probe  # noqa: E402
from harness.topology_config import TopologyConfig  # noqa: E402

PAYLOAD_SIZE = 62


def payload(pair: int, seq: int) -> bytes:
    head = struct.pack("!IQd", pair, seq, time.time())
    return head + b"x" * (PAYLOAD_SIZE - len(head))


def start_brokers(topology: LocalTopology, run_dir: Path, count: int, settings: dict,
                  profile: bool, checkout: Path | None = None) -> list[ProcessNode]:
    config = run_dir / "broker-config.json"
    config.write_text(json.dumps({"broker": settings,
                                  "redis_startup_nodes": [f"{h}:{p}" for h, p in topology.redis_startup_nodes()],
                                  "kafka_bootstrap": topology.kafka_bootstrap()}))
    nodes = []
    for index in range(1, count + 1):
        host, port = topology.addresses.allocate(1883)
        argv = [sys.executable]
        if profile and index == 1:
            argv += ["-m", "cProfile", "-o", str(run_dir / "broker-1.prof")]
        argv += ["-m", "reference_broker", "--config", str(config), "--node-id", f"broker-{index}",
                 "--listen", f"{host}:{port}"]
        node = ProcessNode(f"broker-{index}", "broker", host, port, argv, log_path=run_dir / f"broker-{index}.log",
                           data_dir=run_dir / f"broker-{index}", cwd=checkout or Path.cwd())
        node.start()
        nodes.append(node)
    for node in nodes:
        node.wait_ready(60)
    return nodes


def process_tree(pids: list[int]) -> list[psutil.Process]:
    found = []
    for pid in pids:
        try:
            parent = psutil.Process(pid)
            found += [parent, *parent.children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
    return found


def cpu_seconds(processes: list[psutil.Process]) -> float:
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(args: argparse.Namespace) -> dict:
    run_dir = Path(tempfile.mkdtemp(prefix="broker-p2p-"))
    topology = LocalTopology(TopologyConfig(kafka_storage=args.kafka_storage), run_dir / "topology")
    topology.start()
    brokers: list[ProcessNode] = []
    clients: list[Probe] = []
    try:
        settings = {"producer_acks": args.acks, "incoming_partitions": args.partitions,
                    "persisted_partitions": args.partitions, **dict(args.setting)}
        checkout = Path(args.broker_checkout).resolve() if args.broker_checkout else None
        brokers = start_brokers(topology, run_dir, args.brokers, settings, args.profile, checkout)
        subscribers, publishers = [], []
        for i in range(args.pairs):
            node = brokers[i % len(brokers)]
            sub = Probe(node.host, node.port, f"test_sub_client_{i}_0", version=4)
            sub.connect(clean=False)
            sub.subscribe(f"europe/ua/kyiv/{i}/+", 1)
            pub = Probe(node.host, node.port, f"test_pub_client_{i}_0", version=4)
            pub.connect(clean=True)
            subscribers.append(sub)
            publishers.append(pub)
        clients = subscribers + publishers
        time.sleep(1.0)

        system = process_tree([b.pid for b in brokers] + [n.pid for n in topology.nodes()
                                                          if n.role != "broker" and n.pid])
        broker_procs = process_tree([b.pid for b in brokers])
        puback_latency: list[float] = []
        sent = [0] * args.pairs
        lock = threading.Lock()
        stop_at = time.monotonic() + args.duration

        def publish_loop(index: int) -> None:
            # one thread per publisher, paced, not waiting for acks (as the seeds' perf tool);
            # PUBACK latency is measured from publish() to paho's on_publish for that packet id
            client = publishers[index].client
            started: dict[int, float] = {}

            def on_publish(client, userdata, mid, reason_code=None, properties=None) -> None:
                began = started.pop(mid, None)
                if began is not None:
                    with lock:
                        puback_latency.append(time.monotonic() - began)

            client.on_publish = on_publish
            period = 1.0 / args.rate
            next_at = time.monotonic()
            seq = 0
            while time.monotonic() < stop_at:
                info = client.publish(f"europe/ua/kyiv/{index}/0", payload(index, seq), 1)
                started[info.mid] = time.monotonic()
                seq += 1
                sent[index] = seq
                next_at += period
                time.sleep(max(0.0, next_at - time.monotonic()))
            deadline = time.monotonic() + 30
            while started and time.monotonic() < deadline:
                time.sleep(0.05)

        per_node = {n.name: process_tree([n.pid]) for n in [*topology.nodes(), *brokers] if n.pid}
        node_before = {name: cpu_seconds(procs) for name, procs in per_node.items()}
        s3_log = run_dir / "topology" / "logs" / "s3.log"
        s3_start = log_size(s3_log)
        cpu_before, broker_cpu_before, wall_before = cpu_seconds(system), cpu_seconds(broker_procs), time.monotonic()
        threads = [threading.Thread(target=publish_loop, args=(i,), daemon=True) for i in range(args.pairs)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        expected = sum(sent)
        deadline = time.monotonic() + 30
        while sum(len(s.deliveries) for s in subscribers) < expected and time.monotonic() < deadline:
            time.sleep(0.2)
        wall = time.monotonic() - wall_before
        cpu_used = cpu_seconds(system) - cpu_before
        broker_cpu = cpu_seconds(broker_procs) - broker_cpu_before
        cores_by_node = {name: round((cpu_seconds(procs) - node_before[name]) / wall, 3)
                         for name, procs in per_node.items()}

        s3 = window(s3_log, s3_start, expected)
        e2e, unique, duplicates = [], 0, 0
        for sub in subscribers:
            seen = set()
            for delivery in sub.deliveries:
                pair, seq, sent_at = struct.unpack("!IQd", delivery.payload[:20])
                if (pair, seq) in seen:
                    duplicates += 1
                    continue
                seen.add((pair, seq))
                e2e.append(time.time() - sent_at - (time.monotonic() - delivery.at))
            unique += len(seen)
        total_messages = expected + unique
        result = {
            "pairs": args.pairs, "rate_per_publisher": args.rate, "duration_s": args.duration,
            "broker_nodes": args.brokers, "producer_acks": args.acks, "partitions": args.partitions,
            "kafka_storage": args.kafka_storage, "broker_checkout": str(checkout or Path.cwd()),
            "published": expected, "delivered_unique": unique, "duplicates": duplicates,
            "lost": expected - unique,
            "throughput_msg_s_in_plus_out": round(total_messages / wall, 1),
            "cpu_cores_used_system": round(cpu_used / wall, 2),
            "cpu_cores_used_broker": round(broker_cpu / wall, 2),
            "cpu_cores_by_node": cores_by_node,
            "msg_s_per_core": round(total_messages / cpu_used, 1) if cpu_used else None,
            "tbmq_anchor_msg_s_per_core": 8900,
            "e2e_latency_ms_p50": round(percentile(e2e, 0.5) * 1000, 1),
            "e2e_latency_ms_p99": round(percentile(e2e, 0.99) * 1000, 1),
            "puback_latency_ms_p50": round(percentile(puback_latency, 0.5) * 1000, 1),
            "puback_latency_ms_p99": round(percentile(puback_latency, 0.99) * 1000, 1),
            "e2e_latency_ms_mean": round(statistics.fmean(e2e) * 1000, 1) if e2e else None,
            "settings": settings,
            # S3 requests Tansu made in the measured window (moto's request log), and per published message
            **s3,
            "run_dir": str(run_dir),
        }
    finally:
        for client in clients:
            try:
                client.disconnect()
            except Exception:  # noqa: BLE001 - teardown goes on
                pass
        for node in brokers:
            node.stop(15)
        topology.stop()
    profile_path = run_dir / "broker-1.prof"
    if args.profile and profile_path.exists():
        stats = pstats.Stats(str(profile_path))
        rows = sorted(stats.stats.items(), key=lambda item: item[1][2], reverse=True)[:args.top]
        result["top_profile_tottime"] = [
            {"function": f"{Path(f).name}:{line}:{name}", "calls": nc, "tottime_s": round(tt, 3),
             "cumtime_s": round(ct, 3)} for (f, line, name), (cc, nc, tt, ct, _) in rows]
    return result


def broker_setting(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--setting {text!r}: expected KEY=VALUE")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value  # a bare string


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--rate", type=float, default=20.0, help="messages per second per publisher")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of publishing")
    parser.add_argument("--brokers", type=int, default=1)
    parser.add_argument("--acks", default="1", choices=["0", "1", "all"])
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--kafka-storage", default="s3", choices=["s3", "s3rver", "moto", "memory"],
                        help="Tansu's storage (memory: no S3 server, shows the broker's own limits)")
    parser.add_argument("--profile", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--broker-checkout", default=None,
                        help="run the broker (python -m reference_broker) from this checkout (side-by-side runs)")
    parser.add_argument("--setting", action="append", default=[], type=broker_setting, metavar="KEY=VALUE",
                        help="a broker setting (JSON value), e.g. --setting kafka_fetch_max_wait_ms=100")
    parser.add_argument("--record", action="store_true",
                        help="also append the figures to docs/measurements.md (benchmarks/record.py)")
    args = parser.parse_args(argv)
    for name in ("pairs", "brokers", "partitions"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.rate <= 0 or args.duration <= 0:
        parser.error("--rate and --duration must be positive")
    result = run(args)
    print(json.dumps(result, indent=2))
    if args.record:
        record.append("benchmarks/broker_p2p.py", record.command_line(__file__, argv),
                      record.figures(result, drop=("run_dir", "top_profile_tottime")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
