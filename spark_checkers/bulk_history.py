"""A big synthetic history, written columnar (numpy + pyarrow: seconds for 10 M rows), for the benchmark and for
the Spark server's warm-up (``api.warm_up``).

The seeds' P2P pattern: every publisher (``pub-i``, one message a second) has its own persistent subscriber
(``sub-i`` on ``europe/ua/kyiv/i/+``), QoS 1, packet ids that wrap 65535 -> 1 after 1000 messages, and anomalies
planted at known places: ``lost`` dropped deliveries and ``swaps`` swapped neighbours (so a timing also proves
the answer: the checkers must find exactly these).  ``synthetic.py`` is the other generator: row by row, every
kind of event and anomaly, for run-sized histories.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401 - pa.compute

from contracts.history_schema import EVENT_SCHEMA, Kind, Manifest, Phase, write_manifest, write_part
from spark_checkers import synthetic

INTERVAL_US = 1_000_000  # one message per second per publisher, as in the seeds' P2P test
ROWS_PER_MESSAGE = 4  # invoke, ack, delivery, delivery_ack_sent


def _hex64(values: np.ndarray) -> pa.Array:
    """uint64 -> 16 lowercase hex chars, vectorised."""
    digits = np.frombuffer(b"0123456789abcdef", dtype="S1")
    raw = values.astype(">u8").view(np.uint8).reshape(-1, 8)
    chars = np.empty((len(values), 16), dtype="S1")
    chars[:, 0::2] = digits[raw >> 4]
    chars[:, 1::2] = digits[raw & 15]
    return pa.array(chars.view("S16").ravel()).cast(pa.string())


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64: a stand-in for blake2b of the payload, the same on both sides."""
    z = (x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15))
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _names(prefix: str, indices: np.ndarray, count: int) -> pa.Array:
    dictionary = pa.array([f"{prefix}{i}" for i in range(count)])
    return pa.DictionaryArray.from_arrays(pa.array(indices.astype(np.int32)), dictionary).cast(pa.string())


def generate(run_dir: Path, events: int, *, lost: int = 10, swaps: int = 5, seed: int = 7) -> dict:
    """Write a P2P history of about ``events`` rows; return what was planted."""
    rng = np.random.default_rng(seed)
    pairs = max(1, int(round(events / ROWS_PER_MESSAGE / 2500)))
    per_pub = max(2, events // ROWS_PER_MESSAGE // pairs)
    n = pairs * per_pub
    pub_index = np.repeat(np.arange(pairs), per_pub)
    pub_seq = np.tile(np.arange(1, per_pub + 1), pairs).astype(np.int64)
    t_invoke = 1_000_000 + (pub_seq - 1) * INTERVAL_US + pub_index * 997
    hashes = _hex64(_mix(pub_index.astype(np.uint64) << np.uint64(32) | pub_seq.astype(np.uint64)))
    first_pid = 65535 - 1000  # every subscriber wraps after 1000 messages
    pid = ((first_pid - 1 + pub_seq - 1) % 65535 + 1).astype(np.int32)
    keep = np.ones(n, dtype=bool)
    lost_idx = rng.choice(np.flatnonzero((pub_seq > 1) & (pub_seq < per_pub)), size=lost, replace=False)
    keep[lost_idx] = False
    # swapped neighbours: the identity of message i and i+1 exchanged on the delivery side
    deliver_seq = pub_seq.copy()
    candidates = np.setdiff1d(np.flatnonzero((pub_seq > 1) & (pub_seq < per_pub - 1)), np.concatenate(
        [lost_idx, lost_idx - 1, lost_idx + 1]))
    swap_idx = rng.choice(candidates[::3], size=swaps, replace=False)
    deliver_seq[swap_idx], deliver_seq[swap_idx + 1] = pub_seq[swap_idx + 1], pub_seq[swap_idx]
    deliver_hash_src = pub_index.astype(np.uint64) << np.uint64(32) | deliver_seq.astype(np.uint64)
    d = keep
    columns: dict[str, list] = {name: [] for name in EVENT_SCHEMA.names}

    def block(size: int, **values) -> None:
        for name in EVENT_SCHEMA.names:
            value = values.get(name)
            if value is None:
                columns[name].append(pa.nulls(size, EVENT_SCHEMA.field(name).type))
            elif isinstance(value, pa.Array):
                columns[name].append(value.cast(EVENT_SCHEMA.field(name).type))
            elif np.isscalar(value) or isinstance(value, str | bool):
                columns[name].append(pa.array([value] * size, EVENT_SCHEMA.field(name).type))
            else:
                columns[name].append(pa.array(value).cast(EVENT_SCHEMA.field(name).type))

    pubs, subs = _names("pub-", pub_index, pairs), _names("sub-", pub_index, pairs)
    topics = _names("europe/ua/kyiv/", pub_index, pairs)
    topics = pa.array([f"{t}/0" for t in topics.to_pylist()]) if n <= 0 else pa.compute.binary_join_element_wise(
        topics, pa.array(["/0"] * n), "")
    block(n, t_mono_us=t_invoke, kind=Kind.PUBLISH_INVOKE, client=pubs, node="broker-1", protocol=4, topic=topics,
          qos=1, packet_id=pid, dup=False, retain=False, payload_size=62, publisher=pubs, pub_seq=pub_seq,
          send_wall_us=t_invoke, body_hash=hashes)
    block(n, t_mono_us=t_invoke + 2000, kind=Kind.PUBLISH_ACK, client=pubs, node="broker-1", protocol=4, qos=1,
          packet_id=pid, publisher=pubs, pub_seq=pub_seq, reason_code=0)
    mask = pa.array(d)
    nd = int(d.sum())
    block(nd, t_mono_us=(t_invoke + 5000)[d], kind=Kind.DELIVERY, client=subs.filter(mask), node="broker-1",
          protocol=4, topic=topics.filter(mask), qos=1, packet_id=pid[d], dup=False, retain=False, payload_size=62,
          publisher=pubs.filter(mask), pub_seq=deliver_seq[d], send_wall_us=t_invoke[d],
          body_hash=_hex64(_mix(deliver_hash_src[d])))
    block(nd, t_mono_us=(t_invoke + 5300)[d], kind=Kind.DELIVERY_ACK_SENT, client=subs.filter(mask),
          node="broker-1", protocol=4, qos=1, packet_id=pid[d])
    small = []
    for i in range(pairs):
        small += [dict(t_mono_us=900_000, kind=Kind.CONNECT, client=f"sub-{i}", protocol=4, clean_start=False,
                       session_present=False, reason_code=0),
                  dict(t_mono_us=950_000, kind=Kind.SUBSCRIBE_ACK, client=f"sub-{i}", topic=f"europe/ua/kyiv/{i}/+",
                       qos=1),
                  dict(t_mono_us=900_000, kind=Kind.CONNECT, client=f"pub-{i}", protocol=4, clean_start=True,
                       session_present=False, reason_code=0)]
    end = int(t_invoke.max()) + 2_000_000
    for t, phase, extra in ((0, Phase.RUN_START, {}), (end, Phase.DRAIN_START, {}),
                            (end + 1_000_000, Phase.DRAIN_END, {"reason": "quiet"}), (end + 2_000_000, Phase.RUN_END, {})):
        small.append(dict(t_mono_us=t, kind=Kind.PHASE, detail=json.dumps({"phase": phase, **extra})))
    for i in range(pairs):
        small.append(dict(t_mono_us=end + 1_500_000, kind=Kind.SESSION_SNAPSHOT, client=f"sub-{i}", zset_size=0,
                          last_packet_id=int(pid[pub_index == i][-1]), orphan_payloads=0, dangling_refs=0))
    small_table = pa.Table.from_pylist(small, schema=EVENT_SCHEMA.remove_metadata())
    big = pa.Table.from_arrays([pa.chunked_array(columns[name]) for name in EVENT_SCHEMA.names],
                               schema=EVENT_SCHEMA.remove_metadata())
    table = pa.concat_tables([big, small_table])
    order = pa.compute.sort_indices(table, sort_keys=[("t_mono_us", "ascending")])
    table = table.take(order)
    rows = table.num_rows
    table = table.set_column(0, "seq", pa.array(np.arange(rows, dtype=np.int64)))
    table = table.set_column(2, "t_wall_us", pa.compute.add(table["t_mono_us"], 1_790_000_000_000_000))
    table = table.replace_schema_metadata(EVENT_SCHEMA.metadata)
    history = run_dir / "history"
    shutil.rmtree(run_dir, ignore_errors=True)
    history.mkdir(parents=True)
    part_rows = 2_000_000
    written = [write_part(history, index, table.slice(start, part_rows), compression="snappy")
               for index, start in enumerate(range(0, rows, part_rows))]  # snappy: pyarrow's default, as measured
    write_manifest(history, Manifest(run_id=run_dir.name, complete=True, parts=tuple(written), end_reason="drained",
                                     started_wall_us=1_790_000_000_000_000, updated_wall_us=1_790_000_000_000_000,
                                     meta={"scenario": "bench-p2p", "seed": seed}))
    # The one node's log, clean: a complete run, so the log oracle decides too (without it, it is unknown).
    synthetic.write_logs(history, synthetic.Spec(log_lines=(
        ("broker-1", "broker", "2026-09-21 12:26:41,000 broker-1 INFO reference_broker: broker-1 ready"),)))
    (run_dir / "scenario.json").write_text(json.dumps({"broker": {}, "checks": {}, "target": {"kind": "reference"}}))
    return {"rows": rows, "pairs": pairs, "messages": n, "lost": lost, "swaps": swaps}
