"""Every anomaly planted alone in a synthetic history fails exactly its invariant; every near-miss twin
passes.  All cases (tests/support/anomalies.py) are checked in one Spark batch (one job for dozens of
histories)."""

from __future__ import annotations

import json

import pytest
from support.anomalies import CASES, NO_FAULT, TWO_WINDOWS, UNKNOWN_CASES, write_runs

from contracts.history_schema import Kind
from spark_checkers import synthetic as s
from spark_checkers.api import check_runs

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]  # one Spark batch; slow when the machine is loaded


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return write_runs(tmp_path_factory.mktemp("anomalies"))


@pytest.fixture(scope="module")
def reports(spark, runs):
    return dict(zip(runs, check_runs(list(runs.values()), spark=spark), strict=True))


def test_the_oracle_gives_every_catalog_case_the_checkers_verdicts_and_counts(runs, reports):
    """The oracle (oracle/) beside the checkers on the whole catalog, planted cases and near misses alike: per
    invariant both judge, the same verdict and the same count (the generated histories of
    test_oracle_property.py carry no shared group, no Will and no retained copy; the catalog does)."""
    from oracle import judge
    from oracle.compare import disagreements

    found = {name: [(d.invariant, d.checker, d.oracle) for d in disagreements(reports[name], judge(run_dir))]
             for name, run_dir in runs.items()}
    assert not {name: d for name, d in found.items() if d}


def _judged(report):
    return {i["id"]: (i["verdict"], i["count"], json.dumps(i["witnesses"], sort_keys=True)) for i in report["invariants"]}


def _freezes(build, monkeypatch) -> list[str]:
    """The labels of the tables a check materialises (build.freeze_table), in order."""
    labels, freeze = [], build.freeze_table

    def spy(df, cached, label, *args, **kwargs):
        labels.append(label)
        return freeze(df, cached, label, *args, **kwargs)

    monkeypatch.setattr(build, "freeze_table", spy)
    return labels


# Many redelivered in the nightly tier (about 35 s): the few, looked up, in CI.
@pytest.mark.parametrize("broadcast_rows", [None, pytest.param(0, marks=pytest.mark.nightly)],
                         ids=["few-redelivered", "many-redelivered"])
def test_a_big_check_judges_as_a_small_one(spark, runs, reports, monkeypatch, broadcast_rows):
    """The same histories checked the way a big history is (build.build: the stream neighbours and the queue
    windows only where they are needed, merged back; more partitions, adaptive execution, persisted tables) give
    the same verdicts, counts and witnesses as the small way every other test takes.  Both ways a big check
    gives the messages delivered more than once what only their deliveries in order tell (job/messages.py: with_after_ack):
    looked up for the few, or every message's deliveries in order when there are many."""
    from spark_checkers import api, build
    from spark_checkers.job import messages, sizing

    monkeypatch.setattr(sizing, "SMALL_BYTES", 0)
    if broadcast_rows is not None:
        monkeypatch.setattr(messages, "MULTI_DELIVERY_BROADCAST_ROWS", broadcast_rows)
    ways, build_check = [], api.build

    def spy(*args, small=False, **kwargs):
        ways.append(small)
        return build_check(*args, small=small, **kwargs)

    monkeypatch.setattr(api, "build", spy)
    labels = _freezes(build, monkeypatch)
    big = dict(zip(runs, check_runs(list(runs.values()), spark=spark), strict=True))
    assert ways == [False]  # one batch, checked the big way: else this would compare the small way with itself
    # The catalog redelivers messages: looked up (few), or the per-message table made again the small way (many).
    if broadcast_rows is None:
        assert "messages delivered more than once" in labels and labels.count("per_message") == 1, labels
    else:
        assert "messages delivered more than once" not in labels and labels.count("per_message") == 2, labels
    assert {n: _judged(r) for n, r in big.items()} == {n: _judged(r) for n, r in reports.items()}


ONE_RUN_BIG = ("lost_backlog", "trimmed_at_limit", "trim_not_oldest", "drop_newest_but_dropped_oldest",
               "no_limit_but_trimmed", "reject_but_trimmed", "over_limit_black_box", "dropped_early",
               "expired_while_offline", "kill_loss_promised", "session_lost", "clean",
               # Messages delivered more than once (job/messages.py: with_after_ack looks them up): after the ack, resent before
               # it, twice in one connection.
               "redelivered_after_ack", "legal_resend_with_dup", "backlog_twice_in_connection")
REDELIVERED = ONE_RUN_BIG[-3:]
# In CI an offline window, a queue policy's trim and redeliveries looked up; the rest (a kill, a clean run, a
# backlog twice, ...) in the nightly tier (each is a check of its own: about 20 s apiece on 2 cores).
ONE_RUN_BIG_CI = ("lost_backlog", "trim_not_oldest", "redelivered_after_ack")


@pytest.mark.parametrize("names", [
    pytest.param(ONE_RUN_BIG_CI, id="ci"),
    pytest.param(tuple(n for n in ONE_RUN_BIG if n not in ONE_RUN_BIG_CI), id="rest", marks=pytest.mark.nightly)])
def test_a_one_run_big_check_judges_as_a_small_one(spark, runs, reports, monkeypatch, names):
    """A history checked alone the big way stores its per-subscriber table as primitives, with the run's columns
    as literals and the offline window rebuilt on read (job/materialise.py: freeze_table, flatten): the verdicts, counts and
    witnesses are the small way's, on the histories with offline windows, queue policies, trims, kills and
    redeliveries."""
    from spark_checkers import build
    from spark_checkers.job import sizing

    monkeypatch.setattr(sizing, "SMALL_BYTES", 0)
    stored, freeze = [], build.freeze_table

    def spy(df, cached, label, mode="persist", constant=None, flatten=False, counts=None):
        if label == "per_subscriber_message":
            stored.append(flatten and "policy" in (constant or {}))
        return freeze(df, cached, label, mode, constant, flatten, counts)

    monkeypatch.setattr(build, "freeze_table", spy)
    labels = _freezes(build, monkeypatch)
    looked_up = []
    for name in names:
        labels.clear()
        assert _judged(check_runs([runs[name]], spark=spark)[0]) == _judged(reports[name]), name
        looked_up.append("messages delivered more than once" in labels)
    assert stored == [True] * len(names)  # every one was stored as primitives: else this tests nothing
    # The clean run delivered every message once (job/messages.py: single_delivery alone); the redelivering did not.
    seen = dict(zip(names, looked_up, strict=True))
    assert not seen.get("clean") and all(seen[n] for n in REDELIVERED if n in seen), seen


def _above_the_caches(plan: str) -> str:
    """A physical plan's text without what each InMemoryRelation shows of the plan it cached (indented below it)."""
    kept, inside = [], None
    for line in plan.splitlines():
        depth = len(line) - len(line.lstrip(" :+-|"))
        if inside is not None and depth > inside:
            continue
        inside = depth if "InMemoryRelation" in line else None
        kept.append(line)
    return "\n".join(kept)


def test_a_persisted_table_is_a_leaf_that_keeps_its_partitioning(spark):
    """A big check's persisted table, in a classic session, is the cache's own relation with nothing beneath it
    (later steps are analysed without its lineage), and two tables partitioned by the same key still join
    without moving a row.  On Spark Connect each is read through a temporary view of its own, dropped with it,
    and the two still join without an exchange."""
    from pyspark.sql import functions as F

    from spark_checkers.job import materialise

    def keyed(n):
        return spark.range(n).select((F.col("id") % 7).alias("k"), F.col("id").alias(f"v{n}")).repartition(4, "k") \
            .sortWithinPartitions("k")

    cached: list = []
    a, b = materialise.freeze_table(keyed(100), cached, "a"), materialise.freeze_table(keyed(200), cached, "b")
    try:
        if not hasattr(a, "_jdf"):  # Spark Connect: a view of each table
            views = [table for table in cached if isinstance(table, materialise.TempView)]
            assert len(views) == 2 and len(cached) == 4, cached
            assert {v.name for v in views} <= {t.name for t in spark.catalog.listTables()}
            joined = a.hint("merge").join(b, "k")
            plan = _above_the_caches(joined._explain_string(extended=False))
            assert plan.count("InMemoryRelation") == 2 and "Exchange" not in plan, plan
            assert joined.count() == sum((100 // 7 + (k < 100 % 7)) * (200 // 7 + (k < 200 % 7)) for k in range(7))
            for table in cached:
                table.unpersist()
            assert not {v.name for v in views} & {t.name for t in spark.catalog.listTables()}
            return
        for table in (a, b):
            plan = table._jdf.queryExecution().analyzed()
            assert plan.getClass().getSimpleName() == "InMemoryRelation", plan.toString()
        # A merge join of the two: one stage, reading both caches where they are (a shuffle would add a stage;
        # adaptive execution off, so that it adds no jobs of its own).
        context = spark.sparkContext
        spark.conf.set("spark.sql.adaptive.enabled", "false")
        context.setJobGroup("leaf-test", "merge join of two leaves")
        try:
            rows = a.hint("merge").join(b, "k").collect()
        finally:
            context.setJobGroup("", "")
            spark.conf.set("spark.sql.adaptive.enabled", "true")
        # The status tracker is fed by Spark's listener bus, which runs behind the job: on a loaded machine
        # the join's stage may not be marked complete yet when collect() returns.  Wait for the bus first.
        context._jsc.sc().listenerBus().waitUntilEmpty(60_000)
        tracker = context.statusTracker()
        stages = [tracker.getStageInfo(s) for j in tracker.getJobIdsForGroup("leaf-test")
                  for s in tracker.getJobInfo(j).stageIds]
        ran = [s.name for s in stages if s is not None and s.numCompletedTasks > 0]  # not the cached lineage's
        assert len(ran) == 1, ran
        assert len(rows) == sum((100 // 7 + (k < 100 % 7)) * (200 // 7 + (k < 200 % 7)) for k in range(7))
    finally:
        for table in cached:
            table.unpersist()


def _by_verdict(report, verdict):
    return {item["id"] for item in report["invariants"] if item["verdict"] == verdict}


@pytest.mark.parametrize("name", list(CASES))
def test_exactly_the_planted_invariant_fails(reports, name):
    expected = CASES[name][2]
    report = reports[name]
    assert _by_verdict(report, "fail") == expected, [
        (i["id"], i["verdict"], [w["text"] for w in i["witnesses"]]) for i in report["invariants"] if i["count"]]
    assert _by_verdict(report, "unknown") == set(), [(i["id"], i["reason"]) for i in report["invariants"]
                                                     if i["verdict"] == "unknown"]
    assert report["exit_code"] == (1 if expected else 0)
    for invariant in expected:
        item = next(i for i in report["invariants"] if i["id"] == invariant)
        assert item["witnesses"], f"{invariant} failed without a witness"
        assert all(w["text"] for w in item["witnesses"])


@pytest.mark.parametrize("name", list(UNKNOWN_CASES))
def test_unknown_is_never_a_pass(reports, name):
    report = reports[name]
    unknown = _by_verdict(report, "unknown")
    assert UNKNOWN_CASES[name][3] <= unknown, unknown
    assert _by_verdict(report, "fail") == set()
    assert report["exit_code"] == 2


def _witness(report, invariant):
    item = next(i for i in report["invariants"] if i["id"] == invariant)
    return item["witnesses"][0]


def test_lost_witness_names_message_neighbours_and_fault(reports):
    witness = _witness(reports["lost_middle"], "durability.lost")
    data = witness["data"]
    assert (data["client"], data["publisher"], data["first_seq"], data["last_seq"]) == ("sub-1", "pub-1", 6, 6)
    assert data["position"] == "middle"
    assert (data["prev_delivered"], data["next_delivered"]) == (5, 7)
    assert data["fault"]["fault_id"] == "f1"
    assert "received 5 then 7" in witness["text"] and "redis-7003" in witness["text"]
    assert _witness(reports["lost_suffix"], "durability.lost")["data"]["position"] == "suffix"
    backlog = _witness(reports["lost_backlog"], "durability.lost")
    assert backlog["data"]["in_backlog"] and "reconnected" in backlog["text"]


def test_order_witness_flags_the_wrap(reports):
    wrapped = _witness(reports["out_of_order_wrap"], "order.out_of_order")
    plain = _witness(reports["out_of_order"], "order.out_of_order")["data"]
    assert wrapped["data"]["across_wrap"] is True and plain["across_wrap"] is False
    assert "across a packet-id wrap" in wrapped["text"]
    assert (plain["pub_seq"], plain["after_pub_seq"]) == (4, 5)
    # Lower ids after a new session restarted them: no wrap (the old checker said "across a packet-id wrap").
    restarted = _witness(reports["out_of_order_across_new_session"], "order.out_of_order")
    assert restarted["data"]["packet_id"] < restarted["data"]["after_packet_id"]
    assert restarted["data"]["across_wrap"] is False and restarted["data"]["across_new_session"] is True
    assert "wrap" not in restarted["text"] and "across a new session" in restarted["text"]


def test_loss_is_blamed_on_the_window_it_was_dropped_in(reports):
    """pub-0 #10, queued while sub-0 was offline the first time, was not sent in the 100 ms between the two
    windows (nor the live #11); the loss is the second window's (the old checker named the first)."""
    witness = _witness(reports["kept_unsent_then_lost_in_next_backlog"], "durability.lost")
    data = witness["data"]
    assert (data["first_seq"], data["t_offline"], data["t_reconnect"]) == (
        10, s.slot_time(TWO_WINDOWS, 12) - TWO_WINDOWS.interval_us // 4, s.slot_time(TWO_WINDOWS, 18) - TWO_WINDOWS.interval_us // 4)
    assert data["carried_from_offline"] == s.slot_time(TWO_WINDOWS, 5) - TWO_WINDOWS.interval_us // 4
    assert "offline again at" in witness["text"] and "dropped there" in witness["text"]


def test_new_rule_witnesses_and_their_context(reports):
    """The witnesses of the new rules say what happened, and each carries the history rows around it."""
    twice = _witness(reports["backlog_twice_in_connection"], "duplicates.backlog_twice_in_connection")
    assert (twice["data"]["client"], twice["data"]["pub_seq"]) == ("sub-0", 6)
    assert twice["data"]["again_packet_id"] != twice["data"]["packet_id"] and "same connection" in twice["text"]
    rows = twice["context"]
    connects = [r for r in rows if r["kind"] == "connect"]
    assert connects[-1]["session_present"] is True and connects[-1]["clean_start"] is False
    own = [r for r in rows if r["witness"]]
    assert [r["message"] for r in own] == ["pub-0#6", "pub-0#6"] and all(r["kind"] == "delivery" for r in own)
    assert any(r["kind"] == "ack" for r in rows) and [r["t_s"] for r in rows] == sorted(r["t_s"] for r in rows)
    skip = _witness(reports["packet_id_skips_65535"], "whitebox.packet_id_sequence")
    assert (skip["data"]["prev_packet_id"], skip["data"]["packet_id"], skip["data"]["gap"]) == (65534, 1, 1)
    assert "skipping 1 id(s)" in skip["text"]
    assert [r["packet_id"] for r in skip["context"] if r["kind"] == "delivery"][-3:] != []
    assert {65534, 1} <= {r["packet_id"] for r in skip["context"] if r["kind"] == "delivery"}
    resend = _witness(reports["resend_within_connection_v5"], "order.resend_within_connection")
    assert "MQTT-4.4.0-1" in resend["text"] and resend["data"]["dup"] is True
    assert [r["dup"] for r in resend["context"] if r["witness"]] == [False, True]
    # A fault active in the window is one of the rows.
    lost = _witness(reports["lost_middle"], "durability.lost")
    assert any(r["kind"].startswith("fault") and "redis-7003" in (r["note"] or "") for r in lost["context"])


def test_discarded_session_witness_names_the_connect(reports):
    """The witness names the connect that discarded the session holding the message, and the later session
    that got it anyway; its context shows the subscriber's connects with clean start and session present."""
    witness = _witness(reports["discarded_backlog_after_clean_start"], "durability.discarded_session_delivery")
    data = witness["data"]
    reconnect = [r for r in s.generate(NO_FAULT) if r["kind"] == Kind.CONNECT and r.get("client") == "sub-0"][1]
    assert (data["client"], data["publisher"], data["pub_seq"]) == ("sub-0", "pub-0", 5)
    assert (data["t_session"], data["session_why"]) == (reconnect["t_mono_us"], "clean_start")
    assert data["t_discarded"] == data["t_session"] and data["t_ack"] + 220_000 < data["t_session"]
    assert "with clean start 1" in witness["text"] and "which that connect discarded" in witness["text"]
    assert "MQTT-3.1.2-4" in witness["text"]
    connects = [r for r in witness["context"] if r["kind"] == "connect"]
    assert connects[-1]["clean_start"] is True and connects[-1]["session_present"] is False
    # Through a clean session: the first discard (the clean start) is named, and the later session that got it.
    chain = _witness(reports["discarded_backlog_through_clean_session"], "durability.discarded_session_delivery")
    assert chain["data"]["discarded_why"] == "clean_start" and chain["data"]["session_why"] == "after_clean"
    assert chain["data"]["t_discarded"] < chain["data"]["t_session"]
    assert "still reached the later session" in chain["text"]


def test_reports_match_the_schema(reports):
    import json
    from pathlib import Path

    import jsonschema

    schema = json.loads((Path(__file__).parents[2] / "docs" / "schemas" / "report.schema.json").read_text())
    # kill_loss_not_promised: a report with an "allowed" verdict (a loss the declaration does not cover)
    for name in ("backlog_twice_in_connection", "packet_id_skips_65535", "lost_middle", "clean",
                 "kill_loss_not_promised"):
        jsonschema.validate(reports[name], schema)
    assert "allowed" in {i["verdict"] for i in reports["kill_loss_not_promised"]["invariants"]}


def test_limit_witnesses(reports):
    over = _witness(reports["over_limit_black_box"], "limits.over_limit")["data"]
    assert (over["client"], over["kept"], over["limit"]) == ("sub-0", 6, 3)
    under = _witness(reports["trimmed_under_limit"], "limits.trimmed_under_limit")["data"]
    assert (under["first_seq"], under["rank"], under["n_backlog"]) == (8, 3, 6)
    assert {i["id"]: i["count"] for i in reports["trim_not_oldest"]["invariants"]}["limits.trim_not_oldest"] == 3
    # The count is of the messages on the wrong side of the policy: the newest 3 dropped, not every one dropped.
    long = _item(reports["trim_not_oldest_long_backlog"], "limits.trim_not_oldest")
    assert long["count"] == 3
    [gap] = long["witnesses"]
    assert (gap["data"]["first_seq"], gap["data"]["last_seq"]) == (12, 14)


def test_external_target_has_no_white_box_verdicts(reports):
    report = reports["clean_external"]
    from contracts.invariants import INVARIANTS

    mqtt5_only = {i.id for i in INVARIANTS if i.mqtt5_only}  # its clients speak MQTT 3.1.1 only
    assert _by_verdict(report, "not_applicable") == {"whitebox.orphan_payloads", "whitebox.dangling_refs",
                                                     "whitebox.last_packet_id_behind", "whitebox.packet_id_sequence",
                                                     "limits.trim_not_newest",  # it declares drop_oldest
                                                     # no Will and no retained publish in its workload
                                                     "will.missing", "will.after_normal_disconnect", "will.early",
                                                     "retained.not_last",
                                                     # and no shared subscription
                                                     "shared.lost", "shared.redelivered_after_ack",
                                                     "shared.duplicates"} | mqtt5_only


def test_allowed_violation_is_counted_but_passes(reports):
    item = next(i for i in reports["allowed_redelivery"]["invariants"] if i["id"] == "duplicates.redelivered_after_ack")
    assert (item["verdict"], item["allowed"], item["count"]) == ("pass", True, 1)


def test_counts_and_series(reports):
    report = reports["clean"]
    assert report["counts"]["published"] == 24 and report["counts"]["acked"] == 24
    assert report["counts"]["owed"] == 24 and report["counts"]["delivered_messages"] == 24
    assert report["series"]["owed_unseen"][-1][1] == 0
    assert report["history"]["hash_sha256"]


def test_declared_queue_policy_and_persistence_in_the_report(reports):
    """The report shows what the target promised; a loss it never promised to prevent is *allowed* (its own
    verdict and count), neither a pass nor a violation; rules for another queue policy are not applicable."""
    report = reports["kill_loss_not_promised"]
    allowed = next(i for i in report["invariants"] if i["id"] == "durability.lost_allowed")
    assert (allowed["verdict"], allowed["count"]) == ("allowed", 2)
    assert "persistence = 'graceful'" in allowed["reason"]
    assert "process_kill of broker (f1)" in allowed["witnesses"][0]["text"]
    assert report["summary"]["allowed"] == 1 and report["exit_code"] == 0
    gone = {i["id"]: (i["verdict"], i["count"]) for i in reports["session_lost_to_kill_not_promised"]["invariants"]}
    assert gone["durability.session_lost_allowed"] == ("allowed", 1) and gone["durability.session_lost"] == ("pass", 0)
    assert gone["durability.lost_allowed"] == ("allowed", 6) and gone["durability.lost"] == ("pass", 0)
    assert report["guarantees"]["promises"]["persistence"] == "graceful"
    assert report["guarantees"]["promises"]["losses_allowed_after"] == ["process_kill", "power_loss"]
    policies = {i["id"]: i["verdict"] for i in reports["drop_newest_keeps_oldest"]["invariants"]}
    assert policies["limits.trim_not_oldest"] == "not_applicable" and policies["limits.trim_not_newest"] == "pass"
    none = {i["id"]: (i["verdict"], i["reason"]) for i in reports["no_limit_keeps_all"]["invariants"]}
    assert none["limits.over_limit"][0] == "not_applicable" and "declares no queue limit" in none["limits.over_limit"][1]
    witness = _witness(reports["drop_newest_but_dropped_oldest"], "limits.trim_not_newest")
    assert "counting from the oldest" in witness["text"] and "drops the newest" in witness["text"]


def test_an_unknown_names_its_real_cause(reports):
    """A restart that never came back is said as such, with the node's own words; not "could not be applied"."""
    reason = next(i["reason"] for i in reports["target_never_came_back"]["invariants"] if i["id"] == "meta.fault_bit")
    assert reason == ("fault f1 (process_kill broker) did not heal (the target never came back after it): "
                      "broker (127.0.0.2:1883) not ready after 240.0 s")


def test_log_witnesses_and_the_reported_count(reports):
    failing = next(i for i in reports["log_committing_anyway_must_not_lose"]["invariants"]
                   if i["id"] == "logs.error_lines")
    assert failing["count"] == 1 and failing["witnesses"][0]["data"]["node"] == "broker-1"
    assert "committing anyway" in failing["witnesses"][0]["text"] and "retry_forever" in failing["witnesses"][0]["text"]
    skipped = {i["id"]: i for i in reports["log_committing_anyway_under_skip"]["invariants"]}
    assert skipped["logs.error_lines"]["verdict"] == "pass"
    assert (skipped["logs.reported_lines"]["verdict"], skipped["logs.reported_lines"]["count"]) == ("pass", 1)
    assert "skip" in skipped["logs.reported_lines"]["witnesses"][0]["text"]
    unread = {i["id"]: i for i in reports["log_of_a_node_unread"]["invariants"]}
    assert "redis-2" in unread["logs.error_lines"]["reason"]
    external = {i["id"]: i for i in reports["clean_external"]["invariants"]}
    assert external["logs.error_lines"]["verdict"] == "pass"  # judged by the Mosquitto preset (its start program)


def test_a_witness_names_what_only_the_history_knows(spark, runs, reports, monkeypatch):
    """The Spark side carries names and body hashes as codes (job/codes.py: CODED).  A phantom's body hash and a publisher
    that never connected are no name the driver knows: looked up in the history, the witness names them.  If
    that lookup fails, the verdicts stand, those values show as codes, and a note says why."""
    from spark_checkers import api

    def phantom(report):
        return next(i for i in report["invariants"] if i["id"] == "durability.phantom")

    assert phantom(reports["phantom_body_hash"])["witnesses"][0]["data"]["min_hash"] == "deadbeef00000000"
    assert phantom(reports["phantom_never_published"])["witnesses"][0]["data"]["publisher"] == "pub-9"

    def unreadable(events, codes):
        raise RuntimeError("the history moved away")

    monkeypatch.setattr(api, "lookup_names", unreadable)
    [report] = check_runs([runs["phantom_body_hash"]], spark=spark)
    judged, before = phantom(report), phantom(reports["phantom_body_hash"])
    assert judged["verdict"] == before["verdict"] == "fail"
    assert judged["count"] == before["count"]
    assert judged["witnesses"][0]["data"]["min_hash"].startswith("<code ")
    assert any("could not be read back from the history: RuntimeError: the history moved away" in n
               for n in report["notes"]), report["notes"]


def _item(report, invariant):
    return next(i for i in report["invariants"] if i["id"] == invariant)


def _lost_seqs(report):
    """The (client, publisher, pub_seq) of every lost message the report's gaps list."""
    return {(g["data"]["client"], g["data"]["publisher"], seq) for g in _item(report, "durability.lost")["witnesses"]
            for seq in range(g["data"]["first_seq"], g["data"]["last_seq"] + 1)}


def test_a_returned_session_owes_what_was_acknowledged_while_it_was_said_lost(reports):
    """The session reported lost at slot 6 and presented again at slot 12 is one session: pub-0 #3..#8 (acked from
    its first disconnect to its second) are owed to it and lost, the returned session fails with its witness, and
    the session-loss verdicts say how many acknowledged messages went with the session."""
    report = reports["session_lost_and_returned"]
    assert _lost_seqs(report) == {("sub-0", "pub-0", seq) for seq in range(3, 9)}
    returned = _item(report, "durability.session_returned")
    assert returned["count"] == 1
    [w] = returned["witnesses"]
    assert w["data"]["subscriptions"] == ["europe/ua/kyiv/0/+"]
    assert "got session present = 1" in w["text"] and "came back" in w["text"]
    # Owed from its first disconnect to its return: #3..#8 (lost) and the second window's #9..#11 (delivered).
    assert "9 acknowledged message(s) owed to it from its disconnect to this reconnect, 6 never delivered" in w["text"]
    lost = _item(report, "durability.session_lost")
    assert lost["covers"]["acknowledged_lost"] == 6 and lost["details"]["acknowledged_lost_with_sessions"] == 6
    assert "presented the session again" in lost["witnesses"][0]["text"]
    assert _item(report, "durability.lost")["covers"]["owed"] >= 6


def test_a_new_session_resumed_after_a_loss_is_no_return(reports):
    """Near misses: the new session granted its subscription is what the later session present = 1 presents; a
    session past its own expiry cannot come back.  Only the lost session's backlog (pub-0 #3..#5) is lost."""
    for name in ("session_lost_then_new_session_resumed", "session_lost_then_present_after_its_expiry"):
        report = reports[name]
        assert _item(report, "durability.session_returned")["count"] == 0, name
        assert _lost_seqs(report) == {("sub-0", "pub-0", seq) for seq in range(3, 6)}, name
        [w] = _item(report, "durability.session_lost")["witnesses"]
        assert "3 acknowledged message(s) were owed to it at that reconnect, 3 of them never delivered" in w["text"], name
