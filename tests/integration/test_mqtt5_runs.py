"""The MQTT 5 scenarios end to end (`ordeal run` without the check) against the reference broker: with each MQTT 5
defect switched on the recorded history shows its anomaly, with the correct broker the same scenario and seed
show none.  Assertions on the Parquet rows only (the Spark rules that judge them are spark_checkers' tests)."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections import defaultdict
from pathlib import Path

import pytest

from contracts.history_schema import Kind
from contracts.scenario import find_scenario
from harness.history import read_history
from harness.run import run_scenario

pytestmark = pytest.mark.integration

SEED = 1


@pytest.fixture(scope="module")
def out():
    path = Path(tempfile.mkdtemp(prefix="ordeal-mqtt5-runs-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _run(out: Path, name: str, defects: tuple[str, ...] = ()) -> list[dict]:
    """The rows of ``name`` run with SEED, with ``defects`` added to its [broker] table (as `ordeal selftest`)."""
    source = find_scenario(name)
    path = source
    if defects:
        text = source.read_text()
        listed = ", ".join(f'"{d}"' for d in defects)
        path = out / f"{name}+{'+'.join(defects)}.toml"
        path.write_text(text.replace("[target]", f"[broker]\ndefects = [{listed}]\n\n[target]", 1))
    result = run_scenario(path, SEED, out / (path.stem), check=False)
    assert result.exit_code == 0, result
    return read_history(result.run_dir / "history").to_pylist()


@pytest.fixture(scope="module")
def delivery(out):
    return {"correct": _run(out, "mqtt5-delivery"),
            "defects": _run(out, "mqtt5-delivery", ("qos_upgrade", "expiry_property_dropped",
                                                    "user_properties_dropped"))}


def _deliveries_with_publish(rows: list[dict]) -> list[tuple[dict, dict]]:
    invokes = {(r["publisher"], r["pub_seq"]): r for r in rows if r["kind"] == Kind.PUBLISH_INVOKE}
    return [(d, invokes[(d["publisher"], d["pub_seq"])]) for d in rows if d["kind"] == Kind.DELIVERY]


def test_mqtt5_delivery_correct_broker_keeps_qos_properties_expiry_and_identifiers(delivery):
    pairs = _deliveries_with_publish(delivery["correct"])
    assert pairs and {p["qos"] for _, p in pairs} == {1, 2}
    assert all(d["qos"] == p["qos"] for d, p in pairs)  # min(published, granted 2)
    assert all(d["props"] == p["props"] and p["props"] for d, p in pairs)
    assert all(d["remaining_expiry_s"] is not None for d, p in pairs if p["expiry_s"] is not None)
    subacks = {r["client"]: json.loads(r["detail"])["sub_id"] for r in delivery["correct"]
               if r["kind"] == Kind.SUBSCRIBE_ACK}
    assert all(d["sub_ids"] == str(subacks[d["client"]]) for d, _ in pairs)
    assert not any(d["retain"] for d, _ in pairs)  # nothing was published retained (Retain As Published on)


def test_mqtt5_delivery_defects_show_in_the_rows(delivery):
    pairs = _deliveries_with_publish(delivery["defects"])
    upgraded = [d for d, p in pairs if d["qos"] > p["qos"]]  # qos_upgrade
    assert upgraded and len(upgraded) == sum(1 for _, p in pairs if p["qos"] == 1)
    changed = [d for d, p in pairs if d["props"] != p["props"]]  # user_properties_dropped
    assert len(changed) == len(pairs) and all("user_properties" not in d["props"] for d in changed)
    missing = [d for d, p in pairs if p["expiry_s"] is not None and d["remaining_expiry_s"] is None]
    assert missing and len(missing) == sum(1 for _, p in pairs if p["expiry_s"] is not None)  # expiry_property_dropped


def _max_unacknowledged(rows: list[dict]) -> dict[str, int]:
    """client -> the most QoS > 0 deliveries it had unacknowledged at once on one connection (a resend of a
    packet id in flight counts once)."""
    worst: dict[str, int] = defaultdict(int)
    open_ids: dict[str, set[int]] = defaultdict(set)
    for r in rows:
        client = r["client"]
        if r["kind"] in (Kind.CONNECT, Kind.DISCONNECT):
            open_ids[client] = set()
        elif r["kind"] == Kind.DELIVERY and r["qos"]:
            open_ids[client].add(r["packet_id"])
        elif r["kind"] == Kind.DELIVERY_ACK_SENT:
            open_ids[client].discard(r["packet_id"])
        worst[client] = max(worst[client], len(open_ids[client]))
    return {c: n for c, n in worst.items() if c and c.startswith("test_sub")}


@pytest.mark.nightly  # two runs (about 35 s); the broker's own Receive Maximum tests stay (test_broker_mqtt5_delivery.py)
def test_receive_maximum_kept_by_the_correct_broker_and_not_by_the_defect(out):
    correct = _run(out, "mqtt5-receive-maximum")
    connects = [json.loads(r["detail"]) for r in correct if r["kind"] == Kind.CONNECT
                and r["client"].startswith("test_sub")]
    assert connects and all(c["receive_maximum"] == 2 for c in connects)
    assert set(_max_unacknowledged(correct).values()) == {2}  # withheld acks filled the window, no more
    broken = _max_unacknowledged(_run(out, "mqtt5-receive-maximum", ("receive_maximum_ignored",)))
    assert max(broken.values()) > 2, broken


def _unreleased_after_resume(rows: list[dict]) -> list[tuple[str, str, int]]:
    """QoS 2 messages a subscriber answered with PUBREC on a connection that ended before their release, whose
    session then resumed (session present), and that were never released (no delivery row) afterwards."""
    out = []
    by_client: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        if r["client"] and r["client"].startswith("test_sub"):
            by_client[r["client"]].append(r)
    for client, mine in by_client.items():
        for i, received in enumerate(mine):
            if received["kind"] != Kind.QOS2_RECEIVED:
                continue
            key = (received["publisher"], received["pub_seq"])
            later = mine[i + 1:]
            end = next((j for j, r in enumerate(later) if r["kind"] == Kind.DISCONNECT), None)
            if end is None or any(r["kind"] == Kind.DELIVERY and (r["publisher"], r["pub_seq"]) == key
                                  for r in later[:end]):
                continue  # released on its own connection
            resumed = next((r for r in later[end:] if r["kind"] == Kind.CONNECT), None)
            if resumed is None or not resumed["session_present"]:
                continue
            if not any(r["kind"] == Kind.DELIVERY and (r["publisher"], r["pub_seq"]) == key for r in later[end:]):
                out.append((client, *key))
    return out


def test_pubrel_resent_by_the_correct_broker_and_not_by_the_defect(out):
    correct = _run(out, "qos2-resume")
    # the withheld flows: PUBREC sent, the PUBREL never read, the connection dropped, then resumed and released
    resumed_pubrels = [r for r in correct if r["kind"] == Kind.PUBREL_RECEIVED and json.loads(r["detail"])["known"]]
    assert resumed_pubrels and _unreleased_after_resume(correct) == []
    broken = _run(out, "qos2-resume", ("pubrel_not_resent",))
    assert len(_unreleased_after_resume(broken)) >= 2


@pytest.mark.nightly  # a run of its own (about 30 s); the broker's own Maximum Packet Size tests stay in CI
def test_maximum_packet_size_honoured(out):
    rows = _run(out, "mqtt5-packet-size")
    limits = {r["client"]: json.loads(r["detail"]).get("maximum_packet_size") for r in rows
              if r["kind"] == Kind.CONNECT}
    deliveries = [r for r in rows if r["kind"] == Kind.DELIVERY]
    limited = [r for r in deliveries if limits.get(r["client"])]
    assert limited and all(r["packet_size"] <= limits[r["client"]] for r in limited)
    # the MQTT 5 publishers' messages are larger: an unlimited (MQTT 3.1.1) subscriber gets them at full size,
    # the limited ones never
    protocols = {r["client"]: r["protocol"] for r in rows if r["kind"] == Kind.CONNECT}
    assert not any(protocols[r["publisher"]] == 5 for r in limited)
