"""The small tables built on the driver from the timelines (runs, clients, topic matches): broadcast to every
join they meet and looked up with higher-order functions, never joined row by row."""

from __future__ import annotations

from pyspark.sql import types as T

from contracts.app_clients import is_application
from contracts.topics import filter_matches, matching_filter, shared_filter
from spark_checkers.job.codes import code_of
from spark_checkers.job.events import RunSpec, local_frame
from spark_checkers.timeline import NEVER, Timeline, detail_of


def side_tables(spark, runs: list[RunSpec], timelines: dict[str, Timeline], topics: dict[str, list[str]]):
    """(runs_df, clients_df, match_df): small DataFrames, broadcast to every join they meet."""
    run_rows, client_rows, match_rows = [], [], []  # every client and topic as its code (encode_events)
    for run in runs:
        timeline, g = timelines[run.run_id], run.guarantees
        run_rows.append((run.run_id, g.persisted_messages_limit, g.ttl_us, g.tolerance_us, timeline.fault_times(),
                         timeline.bucket_us, timeline.t_first, g.slack_us, g.queue_policy,
                         unpromised_fault_times(timeline, g), fault_spans(timeline),
                         [(seg.role, seg.t_from, seg.t_to, seg.lo_us, seg.hi_us) for seg in timeline.clock_segments()]))
        clients = set(timeline.connect_seqs) | set(timeline.offline)
        filters: dict[str, set[bool]] = {}
        for sub in timeline.subscriptions:
            filters.setdefault(sub.client, set()).add(shared_filter(sub.topic_filter) is not None)
        shared_only = {client for client, kinds in filters.items() if kinds == {True}}
        for client in clients:
            client_rows.append((run.run_id, code_of(client), timeline.connect_seqs.get(client, []),
                                timeline.fresh_seqs.get(client, []),
                                [(s, t) for s, t in timeline.disconnects.get(client, [])],
                                list(timeline.offline.get(client, [])),
                                [(row["seq"], row["t_mono_us"]) for row in timeline.connects.get(client, [])
                                 if (row.get("reason_code") or 0) < 0x80],
                                timeline.persistent_fresh_seqs.get(client, []),
                                [(n["seq"], n["t"], n["why"], n["clean_start"])
                                 for n in timeline.new_sessions.get(client, [])],
                                [row["seq"] for row in timeline.snapshots if row.get("client") == client
                                 and detail_of(row).get("when") == "preset"],
                                connect_limits(timeline.connects.get(client, [])),
                                is_application(g.application_clients, client),
                                client in shared_only))
        for topic in topics.get(run.run_id, []):
            # A shared subscription matches what its filter matches, but owes the member nothing of its own: its
            # group is owed each message once (spark_checkers/shared.py), so it is never persistent here.
            subs = [(code_of(s.client), s.t_from, s.t_to, s.granted_qos,
                     s.persistent and shared_filter(s.topic_filter) is None,
                     *timeline.sub_options.get((s.client, s.topic_filter, s.t_from), (None, False)),
                     shared_filter(s.topic_filter) is not None)
                    for s in timeline.subscriptions if filter_matches(matching_filter(s.topic_filter), topic)]
            if subs:
                match_rows.append((run.run_id, code_of(topic), subs, sorted({s[0] for s in subs})))
    L, S, B, N = T.LongType(), T.StringType(), T.BooleanType(), T.IntegerType()
    runs_df = local_frame(spark, run_rows, T.StructType([
        T.StructField("run_id", S), T.StructField("limit", N), T.StructField("ttl_us", L),
        T.StructField("tol_us", L), T.StructField("fault_times", T.ArrayType(L)), T.StructField("bucket_us", L),
        T.StructField("t_origin", L), T.StructField("slack_us", L), T.StructField("policy", S),
        T.StructField("unpromised_times", T.ArrayType(L)),
        # Every fault and node event as [s, e] (e: the heal, NEVER if none; an event: s = e).
        T.StructField("fault_spans", T.ArrayType(T.StructType([T.StructField("s", L), T.StructField("e", L)]))),
        # The clock timeline (Timeline.clock_segments): each node's offset stretches [t_from, t_to) with their least
        # and most offset (µs); empty for a run without clock rows (job/clock.py: every skew is then 0).
        T.StructField("clock_rows", T.ArrayType(T.StructType([
            T.StructField("role", S), T.StructField("t_from", L), T.StructField("t_to", L), T.StructField("lo", L),
            T.StructField("hi", L)])))]))
    clients_df = local_frame(spark, client_rows, T.StructType([
        T.StructField("run_id", S), T.StructField("client", L), T.StructField("connect_seqs", T.ArrayType(L)),
        T.StructField("fresh_seqs", T.ArrayType(L)),
        T.StructField("disconnects", T.ArrayType(T.StructType([T.StructField("seq", L), T.StructField("t", L)]))),
        T.StructField("offline", T.ArrayType(T.StructType([T.StructField("idx", N), T.StructField("d", L),
                                                           T.StructField("c", L),
                                                           T.StructField("discarded", B)]))),
        # Accepted connects (CONNACK reason < 0x80) as (seq, t): when each connection was established.
        T.StructField("connects", T.ArrayType(T.StructType([T.StructField("seq", L), T.StructField("t", L)]))),
        T.StructField("persistent_fresh_seqs", T.ArrayType(L)),
        # The connects that legally began a new session, discarding the one before (Timeline.new_sessions).
        T.StructField("new_sessions", T.ArrayType(T.StructType([
            T.StructField("seq", L), T.StructField("t", L), T.StructField("why", S),
            T.StructField("clean_start", B)]))),
        # The harness's packet-id presets (session_snapshot rows with when = "preset"): each one sets the
        # session's stored counter, so the ids after it start a new run of the sequence.
        T.StructField("preset_seqs", T.ArrayType(L)),
        # One per connect row, in the order of connect_seqs: what that CONNECT sent of MQTT 5 flow control (null:
        # none, an MQTT 3.1.1 connect; Receive Maximum absent = 65535, Maximum Packet Size absent = no limit).
        T.StructField("conn_limits", T.ArrayType(T.StructType([
            T.StructField("seq", L), T.StructField("t", L), T.StructField("receive_maximum", N),
            T.StructField("maximum_packet_size", L)]))),
        # An APPLICATION client of the reference broker (its application_clients rules, contracts/app_clients.py):
        # its messages wait in a Kafka topic of its own, not in lua/save.lua's session store.
        T.StructField("application", B),
        # Every subscription the client held was a shared one ($share/NAME/FILTER): it gets its groups' messages.
        T.StructField("shared_only", B)]))
    match_df = local_frame(spark, match_rows, T.StructType([
        T.StructField("run_id", S), T.StructField("topic", L),
        T.StructField("subs", T.ArrayType(T.StructType([
            T.StructField("client", L), T.StructField("t_from", L), T.StructField("t_to", L),
            T.StructField("granted", N), T.StructField("persistent", B),
            # The SUBSCRIBE's options (Timeline.sub_options): its Subscription Identifier, Retain As Published.
            T.StructField("sub_id", L), T.StructField("rap", B),
            # A shared subscription ($share/GROUP/FILTER): the group is owed the message, not this member.
            T.StructField("shared", B)]))),
        # The distinct clients of subs: every claim on the topic is one of them.
        T.StructField("clients", T.ArrayType(L))]))
    return runs_df, clients_df, match_df


def connect_limits(connects: list[dict]) -> list[tuple]:
    """(seq, t, Receive Maximum, Maximum Packet Size) of each connect row, as its CONNECT sent them (detail keys
    receive_maximum / maximum_packet_size; null when absent or not MQTT 5)."""
    out = []
    for row in connects:
        detail = detail_of(row) if row.get("protocol") == 5 else {}
        out.append((row["seq"], row["t_mono_us"], detail.get("receive_maximum"), detail.get("maximum_packet_size")))
    return out


def fault_spans(timeline: Timeline) -> list[tuple[int, int]]:
    """Every fault as (start, heal or NEVER) and every node event as (t, t): the times a fault may explain a
    duplicate or a stored packet id no delivery shows (a save repeated after a failure, a rolled-back removal)."""
    spans = [(f.t_start, f.t_heal if f.t_heal is not None else NEVER) for f in timeline.faults]
    spans += [(e["t_mono_us"], e["t_mono_us"]) for e in timeline.node_events]
    return sorted(spans)


def unpromised_fault_times(timeline: Timeline, g) -> list[int]:
    """Start times of the faults whose losses the target's declared persistence does not cover (a kill of a
    broker that promises only a graceful stop): a message lost to one is *allowed*, not a violation."""
    kinds = g.unpromised_faults
    return sorted(f.t_start for f in timeline.faults
                  if f.kind in kinds and g.of_target(f.node))
