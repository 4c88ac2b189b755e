"""TBMQ's P2P and fan-in performance patterns at small scale, against the reference broker on the local topology.

P2P (``--pattern p2p``, the default): N pairs: publisher ``test_pub_client_<i>_0`` publishes QoS 1, 62-byte
payloads to ``europe/ua/kyiv/<i>/0`` at ``--rate`` msg/s; subscriber ``test_sub_client_<i>_0`` is a persistent
DEVICE client (`CleanSession = 0`) on ``europe/ua/kyiv/<i>/+``.

Fan-in (``--pattern fan-in``): ``--publishers`` device publishers ``test_pub_client_<j>_0`` publish the same way
to ``europe/ua/kyiv/fanin/<j>`` (the topics of Ordeal's fan-in plans), and ``--subscribers`` persistent
APPLICATION clients ``test_app_client_<k>_0`` (made so by the broker's ``application_clients`` rule
``test_app_client_*``: a Kafka topic each, reference_broker/application.py) subscribe ``europe/ua/kyiv/fanin/+``
and each receive every message.

``--pattern both``: P2P and fan-in alternately on the same topology and broker config, ``--rounds`` rounds of
each (p2p, fan-in, p2p, fan-in, ...), only the round's own clients connected in it; reports each round, each
pattern over its rounds, and the ratio fan-in / P2P (msg/s per core above all): the one figure to compare, since
both were measured side by side on the same machine at the same time.

Each reports msg/s (in + out, as TBMQ counts), msg/s per CPU core actually used by the broker + Redis + Kafka
(+ S3) processes, p50/p99 end-to-end and PUBACK latency, lost/duplicated counts, and the broker's top profile
entries (cProfile of broker-1).  A message lost (published, never delivered to a subscriber owed it) fails the
run: it is said on stderr and the exit code is 1 (nothing is recorded).

    .venv/bin/python benchmarks/broker_p2p.py --pairs 20 --rate 20 --duration 20
    .venv/bin/python benchmarks/broker_p2p.py --pairs 20 --rate 20 --duration 15 --no-profile --record
    .venv/bin/python benchmarks/broker_p2p.py --pattern both --pairs 20 --publishers 20 --subscribers 3 \\
        --rate 20 --duration 15 --rounds 2 --no-profile --record

``--record`` also appends the figures to docs/measurements.md (benchmarks/record.py).

TBMQ's anchor: ~8,900 msg/s per CPU core over the whole setup (docs/tbmq-notes.md).
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import statistics
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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
HEAD = struct.Struct("!IIQd")  # round, publisher index, sequence number, time.time() at publish
PATTERNS = ("p2p", "fan-in")
FANIN_FILTER = "europe/ua/kyiv/fanin/+"
APP_CLIENT_GLOB = "test_app_client_*"  # the broker's application_clients rule for the fan-in subscribers
TBMQ_ANCHOR = 8900


def payload(pair: int, seq: int, round_no: int = 0) -> bytes:
    head = HEAD.pack(round_no, pair, seq, time.time())
    return head + b"x" * (PAYLOAD_SIZE - len(head))


@dataclass(frozen=True)
class Workload:
    """One pattern's clients: publishers (client id, topic) and subscribers (client id, filter, the indices of
    the publishers whose every message it is owed)."""

    pattern: str
    publishers: tuple[tuple[str, str], ...]
    subscribers: tuple[tuple[str, str, tuple[int, ...]], ...]


def p2p_workload(pairs: int) -> Workload:
    return Workload("p2p",
                    tuple((f"test_pub_client_{i}_0", f"europe/ua/kyiv/{i}/0") for i in range(pairs)),
                    tuple((f"test_sub_client_{i}_0", f"europe/ua/kyiv/{i}/+", (i,)) for i in range(pairs)))


def fanin_workload(publishers: int, subscribers: int) -> Workload:
    """Ordeal's fan-in plans' topics (properties/generate.py); the subscribers are named for the APPLICATION rule
    (the plans' ``test_sub_client_<k>_0`` are P2P's DEVICE subscribers here, on the same broker)."""
    everyone = tuple(range(publishers))
    return Workload("fan-in",
                    tuple((f"test_pub_client_{j}_0", f"europe/ua/kyiv/fanin/{j}") for j in range(publishers)),
                    tuple((f"test_app_client_{k}_0", FANIN_FILTER, everyone) for k in range(subscribers)))


def schedule(pattern: str, rounds: int) -> list[str]:
    """The rounds in order: one pattern ``rounds`` times, or (``both``) P2P and fan-in alternately."""
    if pattern == "both":
        return [name for _ in range(rounds) for name in PATTERNS]
    if pattern not in PATTERNS:
        raise ValueError(f"pattern {pattern!r}: expected p2p, fan-in or both")
    return [pattern] * rounds


def tally(workload: Workload, sent: Sequence[int], deliveries: Sequence[Sequence[tuple[bytes, float]]],
          round_no: int, clock_offset: float) -> tuple[dict[str, int], list[float]]:
    """Counts of one round from each subscriber's deliveries ((payload, arrival on the monotonic clock), in the
    order of ``workload.subscribers``) and each publisher's count of messages sent: owed (every message of every
    stream a subscriber is owed), delivered once, duplicated, lost (owed, not delivered), unexpected (not owed
    to that subscriber, or not a payload of this benchmark) and redeliveries of an earlier round's messages; and
    the end-to-end latencies in seconds (``clock_offset`` = time.time() - time.monotonic())."""
    owed = unique = duplicates = unexpected = earlier = 0
    e2e: list[float] = []
    for (_, _, streams), received in zip(workload.subscribers, deliveries, strict=True):
        owed_streams = set(streams)
        owed += sum(sent[j] for j in streams)
        seen: set[tuple[int, int]] = set()
        for data, at in received:
            try:
                round_of, pub, seq, sent_at = HEAD.unpack_from(data)
            except struct.error:
                unexpected += 1
                continue
            if round_of != round_no:
                earlier += 1
                continue
            if pub not in owed_streams or seq >= sent[pub]:
                unexpected += 1
                continue
            if (pub, seq) in seen:
                duplicates += 1
                continue
            seen.add((pub, seq))
            e2e.append(at + clock_offset - sent_at)
        unique += len(seen)
    return ({"owed": owed, "delivered_unique": unique, "duplicates": duplicates, "lost": owed - unique,
             "unexpected": unexpected, "from_earlier_rounds": earlier}, e2e)


def rates(published: int, unique: int, wall: float, cpu_system: float, cpu_broker: float,
          e2e: Sequence[float], puback: Sequence[float]) -> dict[str, object]:
    """The derived figures of a window: msg/s in + out (published + delivered once, as TBMQ counts), cores used,
    msg/s per core used by the whole system, latency percentiles in ms."""
    total = published + unique
    return {
        "throughput_msg_s_in_plus_out": round(total / wall, 1) if wall else None,
        "cpu_cores_used_system": round(cpu_system / wall, 2) if wall else None,
        "cpu_cores_used_broker": round(cpu_broker / wall, 2) if wall else None,
        "msg_s_per_core": round(total / cpu_system, 1) if cpu_system else None,
        "tbmq_anchor_msg_s_per_core": TBMQ_ANCHOR,
        "e2e_latency_ms_p50": round(percentile(list(e2e), 0.5) * 1000, 1),
        "e2e_latency_ms_p99": round(percentile(list(e2e), 0.99) * 1000, 1),
        "puback_latency_ms_p50": round(percentile(list(puback), 0.5) * 1000, 1),
        "puback_latency_ms_p99": round(percentile(list(puback), 0.99) * 1000, 1),
        "e2e_latency_ms_mean": round(statistics.fmean(e2e) * 1000, 1) if e2e else None,
    }


COUNTS = ("published", "owed", "delivered_unique", "duplicates", "lost", "unexpected", "from_earlier_rounds")
SECONDS = ("wall_s", "cpu_s_system", "cpu_s_broker")


def combine(rounds: Sequence[Mapping[str, object]], samples: Sequence[tuple[list[float], list[float]]]
            ) -> dict[str, object]:
    """One pattern over its rounds: counts, seconds and CPU seconds summed (msg/s and msg/s per core are the
    totals' ratios, not a mean of the rounds' ratios), latency percentiles over every round's samples
    (``samples``: (e2e, PUBACK) seconds of each round)."""
    summed: dict[str, object] = {"rounds": len(rounds)}
    for key in COUNTS:
        summed[key] = sum(r[key] for r in rounds)
    for key in SECONDS:
        summed[key] = round(sum(r[key] for r in rounds), 3)
    e2e = [value for pair in samples for value in pair[0]]
    puback = [value for pair in samples for value in pair[1]]
    summed.update(rates(summed["published"], summed["delivered_unique"], summed["wall_s"],
                        summed["cpu_s_system"], summed["cpu_s_broker"], e2e, puback))
    return summed


RATIO_FIGURES = ("msg_s_per_core", "throughput_msg_s_in_plus_out", "cpu_cores_used_system", "e2e_latency_ms_p50",
                 "e2e_latency_ms_p99")


def ratio(numerator: object, denominator: object) -> float | None:
    if not isinstance(numerator, (int, float)) or not isinstance(denominator, (int, float)) or not denominator:
        return None
    return round(numerator / denominator, 3)


def compare(fan_in: Mapping[str, object], p2p: Mapping[str, object],
            pairs: Sequence[tuple[Mapping[str, object], Mapping[str, object]]] = ()) -> dict[str, object]:
    """fan-in / P2P of the figures that compare across patterns, over all rounds, and of msg/s per core round by
    round (``pairs``: (fan-in round, the P2P round before it)), which shows how much the ratio moves."""
    compared: dict[str, object] = {name: ratio(fan_in.get(name), p2p.get(name)) for name in RATIO_FIGURES}
    if pairs:
        compared["msg_s_per_core_by_round"] = [ratio(f.get("msg_s_per_core"), p.get("msg_s_per_core"))
                                               for f, p in pairs]
    return compared


def problems(rounds: Sequence[Mapping[str, object]]) -> list[str]:
    """What makes the run's figures no measurement, by round: a message lost (owed, not delivered by the round's
    end) or a delivery nobody was owed."""
    found = []
    for r in rounds:
        where = f"round {r['round']} ({r['pattern']})"
        if r["lost"]:
            found.append(f"{where}: {r['lost']} of {r['owed']} owed messages LOST (not delivered by the round's "
                         "end: --drain-timeout s after publishing ended)")
        if r["unexpected"]:
            found.append(f"{where}: {r['unexpected']} deliveries nobody was owed")
    return found


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


def publish_loop(client, topic: str, index: int, round_no: int, rate: float, stop_at: float, sent: list[int],
                 puback_latency: list[float], lock: threading.Lock) -> None:
    """One publisher's thread: paced, not waiting for acks (as the seeds' perf tool); PUBACK latency is measured
    from publish() to paho's on_publish for that packet id."""
    started: dict[int, float] = {}

    def on_publish(client, userdata, mid, reason_code=None, properties=None) -> None:
        began = started.pop(mid, None)
        if began is not None:
            with lock:
                puback_latency.append(time.monotonic() - began)

    client.on_publish = on_publish
    period = 1.0 / rate
    next_at = time.monotonic()
    seq = 0
    while time.monotonic() < stop_at:
        info = client.publish(topic, payload(index, seq, round_no), 1)
        started[info.mid] = time.monotonic()
        seq += 1
        sent[index] = seq
        next_at += period
        time.sleep(max(0.0, next_at - time.monotonic()))
    deadline = time.monotonic() + 30
    while started and time.monotonic() < deadline:
        time.sleep(0.05)


@dataclass
class Meters:
    """The processes whose CPU a round counts (found once, after the brokers started) and moto's request log."""

    system: list[psutil.Process]
    brokers: list[psutil.Process]
    per_node: dict[str, list[psutil.Process]]
    s3_log: Path


def _unique_deliveries(subscribers: list[Probe]) -> int:
    return sum(len({d.payload[:16] for d in list(s.deliveries)}) for s in subscribers)


def measure_round(workload: Workload, round_no: int, brokers: list[ProcessNode], meters: Meters,
                  args: argparse.Namespace) -> tuple[dict, list[float], list[float]]:
    """One round of one pattern: its subscribers connect (persistent sessions, resumed after the first round)
    and subscribe, its publishers connect, every publisher publishes for ``--duration`` s, the round lasts until
    every owed message was delivered once (or ``--drain-timeout`` more seconds), then its clients disconnect.
    Returns the round's figures and its e2e and PUBACK latency samples (s)."""
    subscribers: list[Probe] = []
    publishers: list[Probe] = []
    try:
        for k, (client_id, topic_filter, _) in enumerate(workload.subscribers):
            node = brokers[k % len(brokers)]
            sub = Probe(node.host, node.port, client_id, version=4)
            subscribers.append(sub)
            sub.connect(clean=False, timeout=60)  # an APPLICATION client's first CONNACK waits for its topic
            sub.subscribe(topic_filter, 1, timeout=30)
        for j, (client_id, _) in enumerate(workload.publishers):
            node = brokers[j % len(brokers)]
            pub = Probe(node.host, node.port, client_id, version=4)
            publishers.append(pub)
            pub.connect(clean=True)
        time.sleep(1.0)

        puback_latency: list[float] = []
        sent = [0] * len(workload.publishers)
        lock = threading.Lock()
        node_before = {name: cpu_seconds(procs) for name, procs in meters.per_node.items()}
        s3_start = log_size(meters.s3_log)
        cpu_before, broker_cpu_before = cpu_seconds(meters.system), cpu_seconds(meters.brokers)
        wall_before = time.monotonic()
        stop_at = wall_before + args.duration
        threads = [threading.Thread(target=publish_loop, daemon=True,
                                    args=(publishers[j].client, topic, j, round_no, args.rate, stop_at, sent,
                                          puback_latency, lock))
                   for j, (_, topic) in enumerate(workload.publishers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        owed = sum(sent[j] for _, _, streams in workload.subscribers for j in streams)
        deadline = time.monotonic() + args.drain_timeout
        while time.monotonic() < deadline:
            if sum(len(s.deliveries) for s in subscribers) >= owed and _unique_deliveries(subscribers) >= owed:
                break
            time.sleep(0.2)
        wall = time.monotonic() - wall_before
        cpu_used = cpu_seconds(meters.system) - cpu_before
        broker_cpu = cpu_seconds(meters.brokers) - broker_cpu_before
        cores_by_node = {name: round((cpu_seconds(procs) - node_before[name]) / wall, 3)
                         for name, procs in meters.per_node.items()}
        received = [[(d.payload, d.at) for d in list(s.deliveries)] for s in subscribers]
    finally:
        for client in subscribers + publishers:
            try:
                client.disconnect()
            except Exception:  # noqa: BLE001 - teardown goes on
                pass
    published = sum(sent)
    counts, e2e = tally(workload, sent, received, round_no, time.time() - time.monotonic())
    figures = {
        "round": round_no, "pattern": workload.pattern,
        "publishers": len(workload.publishers), "subscribers": len(workload.subscribers),
        "published": published, **counts,
        "wall_s": round(wall, 3), "cpu_s_system": round(cpu_used, 3), "cpu_s_broker": round(broker_cpu, 3),
        **rates(published, counts["delivered_unique"], wall, cpu_used, broker_cpu, e2e, puback_latency),
        "cpu_cores_by_node": cores_by_node,
        # S3 requests Tansu made in the measured window (moto's request log), and per published message
        **window(meters.s3_log, s3_start, published),
    }
    return figures, e2e, puback_latency


def run(args: argparse.Namespace) -> dict:
    plan = schedule(args.pattern, args.rounds)
    workloads = {"p2p": p2p_workload(args.pairs), "fan-in": fanin_workload(args.publishers, args.subscribers)}
    run_dir = Path(tempfile.mkdtemp(prefix="broker-p2p-"))
    load_before = os.getloadavg()[0]  # the machine is shared: how busy it was, beside the figures
    topology = LocalTopology(TopologyConfig(kafka_storage=args.kafka_storage), run_dir / "topology")
    topology.start()
    brokers: list[ProcessNode] = []
    rounds: list[dict] = []
    samples: list[tuple[list[float], list[float]]] = []
    try:
        settings = {"producer_acks": args.acks, "incoming_partitions": args.partitions,
                    "persisted_partitions": args.partitions}
        if "fan-in" in plan:  # the fan-in subscribers are APPLICATION clients (a Kafka topic each)
            settings["application_clients"] = [{"client_id": APP_CLIENT_GLOB}]
        settings.update(dict(args.setting))
        checkout = Path(args.broker_checkout).resolve() if args.broker_checkout else None
        brokers = start_brokers(topology, run_dir, args.brokers, settings, args.profile, checkout)
        meters = Meters(
            system=process_tree([b.pid for b in brokers] + [n.pid for n in topology.nodes()
                                                            if n.role != "broker" and n.pid]),
            brokers=process_tree([b.pid for b in brokers]),
            per_node={n.name: process_tree([n.pid]) for n in [*topology.nodes(), *brokers] if n.pid},
            s3_log=run_dir / "topology" / "logs" / "s3.log")
        for number, name in enumerate(plan, 1):
            figures, e2e, puback = measure_round(workloads[name], number, brokers, meters, args)
            rounds.append(figures)
            samples.append((e2e, puback))
            print(f"round {number}/{len(plan)} {name}: {figures['throughput_msg_s_in_plus_out']} msg/s in+out, "
                  f"{figures['msg_s_per_core']} msg/s per core, e2e p50/p99 {figures['e2e_latency_ms_p50']}/"
                  f"{figures['e2e_latency_ms_p99']} ms, lost {figures['lost']}, duplicates "
                  f"{figures['duplicates']}, redelivered from earlier rounds {figures['from_earlier_rounds']}",
                  file=sys.stderr, flush=True)
        load_after = os.getloadavg()[0]
    finally:
        for node in brokers:
            node.stop(15)
        topology.stop()
    setup = {"broker_nodes": args.brokers, "producer_acks": args.acks, "partitions": args.partitions,
             "kafka_storage": args.kafka_storage, "broker_checkout": str(checkout or Path.cwd()),
             "load_avg_1m_start": round(load_before, 2), "load_avg_1m_end": round(load_after, 2)}
    if plan == ["p2p"]:
        # one P2P round: the figures as this benchmark always printed them
        only = {k: v for k, v in rounds[0].items() if k not in ("round", "pattern", "publishers", "subscribers")}
        result = {"pairs": args.pairs, "rate_per_publisher": args.rate, "duration_s": args.duration, **setup,
                  **only, "settings": settings, "run_dir": str(run_dir)}
    else:
        workload_shape = {"rate_per_publisher": args.rate, "duration_s": args.duration, "rounds_per_pattern":
                          args.rounds}
        if "p2p" in plan:
            workload_shape["pairs"] = args.pairs
        if "fan-in" in plan:
            workload_shape.update(publishers=args.publishers, subscribers=args.subscribers)
        by_pattern = {name: combine([r for r in rounds if r["pattern"] == name],
                                    [s for r, s in zip(rounds, samples, strict=True) if r["pattern"] == name])
                      for name in PATTERNS if name in plan}
        result = {"pattern": args.pattern, **workload_shape, **setup, "rounds": rounds,
                  **{name.replace("-", "_"): figures for name, figures in by_pattern.items()}}
        if len(by_pattern) == 2:
            p2p_rounds = [r for r in rounds if r["pattern"] == "p2p"]
            fan_rounds = [r for r in rounds if r["pattern"] == "fan-in"]
            result["fan_in_over_p2p"] = compare(by_pattern["fan-in"], by_pattern["p2p"],
                                                list(zip(fan_rounds, p2p_rounds, strict=True)))
        result.update(settings=settings, run_dir=str(run_dir))
    profile_path = run_dir / "broker-1.prof"
    if args.profile and profile_path.exists():
        stats = pstats.Stats(str(profile_path))
        rows = sorted(stats.stats.items(), key=lambda item: item[1][2], reverse=True)[:args.top]
        result["top_profile_tottime"] = [
            {"function": f"{Path(f).name}:{line}:{name}", "calls": nc, "tottime_s": round(tt, 3),
             "cumtime_s": round(ct, 3)} for (f, line, name), (cc, nc, tt, ct, _) in rows]
    return result


def record_rows(result: Mapping[str, object]) -> list[dict[str, object]]:
    """The figures as one table: one column per round, per pattern over its rounds and (both patterns) the ratio
    fan-in / P2P, one row per figure; the run's set-up in a last column.  A single P2P round keeps its
    two-column table."""
    if "rounds" not in result:
        return record.figures(result, drop=("run_dir", "top_profile_tottime"))
    columns = [{"run": f"{r['pattern']} {r['round']}",
                **{k: v for k, v in r.items() if k not in ("round", "pattern")}} for r in result["rounds"]]
    columns += [{"run": f"{name} all", **result[name.replace("-", "_")]} for name in PATTERNS
                if name.replace("-", "_") in result]
    if "fan_in_over_p2p" in result:
        columns.append({"run": "fan-in / p2p", **result["fan_in_over_p2p"]})
    shown = ("rounds", "p2p", "fan_in", "fan_in_over_p2p", "pattern", "pairs", "publishers", "subscribers",
             "run_dir", "top_profile_tottime")
    columns.append({"run": "setup", **{k: v for k, v in result.items() if k not in shown}})
    return record.transpose(columns, by="run")


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
    parser.add_argument("--pattern", default="p2p", choices=["p2p", "fan-in", "both"],
                        help="both: P2P and fan-in rounds alternately on the same topology, with the ratio")
    parser.add_argument("--pairs", type=int, default=20, help="P2P: publisher/subscriber pairs")
    parser.add_argument("--publishers", type=int, default=20, help="fan-in: device publishers")
    parser.add_argument("--subscribers", type=int, default=3,
                        help="fan-in: persistent APPLICATION subscribers, each owed every message")
    parser.add_argument("--rounds", type=int, default=None,
                        help="rounds of each pattern (default 1; 2 with --pattern both)")
    parser.add_argument("--rate", type=float, default=20.0, help="messages per second per publisher")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of publishing (per round)")
    parser.add_argument("--drain-timeout", type=float, default=30.0,
                        help="seconds a round waits after publishing for every owed message")
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
    if args.rounds is None:
        args.rounds = 2 if args.pattern == "both" else 1
    for name in ("pairs", "publishers", "subscribers", "rounds", "brokers", "partitions"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.rate <= 0 or args.duration <= 0 or args.drain_timeout <= 0:
        parser.error("--rate, --duration and --drain-timeout must be positive")
    result = run(args)
    print(json.dumps(result, indent=2))
    failed = problems(result["rounds"] if "rounds" in result else [{"round": 1, "pattern": "p2p", **result}])
    if failed:
        bar = "!" * 78
        print("\n".join([bar, "MESSAGES LOST: these figures are no measurement (nothing recorded)", *failed, bar]),
              file=sys.stderr)
        return 1
    if args.record:
        record.append("benchmarks/broker_p2p.py", record.command_line(__file__, argv), record_rows(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
