"""One check's plan, wired: which tables are materialised, in which order and beside which (``build``), and the
registry's rules over each of them (``delivered_checks``; the loss rules over the open messages).  What a
caller gets to collect is a ``Checks``.

Shape, chosen to keep shuffles few: one groupBy per message on the publisher side; one window over each
(subscriber, packet id) slot; one groupBy per (subscriber, message); the owed candidates joined once to the
deliveries, with a window clustered by subscriber (backlog rank; in a big check over the queued rows only); a
message's stream neighbours only where they can matter (the order rule's: in a big check, only for publishers
whose messages arrived out of order; the loss rules': only for streams with a never-delivered candidate).  The
small tables (subscriptions, offline windows, faults) are broadcast, looked up with higher-order functions,
never joined row by row."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from functools import reduce
from typing import Any

from pyspark.sql import functions as F

from spark_checkers.collect import collect_all
from spark_checkers.job.codes import encode_events
from spark_checkers.job.columns import SUBSCRIBER_MESSAGE
from spark_checkers.job.events import RunSpec, local_frame
from spark_checkers.job.materialise import freeze_mode, freeze_table
from spark_checkers.job.messages import (
    deliveries_per_message,
    delivery_slots,
    message_deliveries,
    publishes,
    stream_neighbours,
    subscriber_partitioning,
    with_after_ack,
    with_stream_neighbour,
)
from spark_checkers.job.metrics import delivery_metrics
from spark_checkers.job.queues import backlog_queues, online_trims, open_messages, per_subscriber_message
from spark_checkers.job.side_tables import side_tables
from spark_checkers.job.subscribers import (
    delivered_messages,
    subscriber_claims,
    subscriber_rows,
)
from spark_checkers.job.timing import timed
from spark_checkers.rules import catalog
from spark_checkers.rules.columns import message_table
from spark_checkers.rules.flow import in_flight
from spark_checkers.rules.losses import LOSS_INVARIANTS, owed_checks, with_cause
from spark_checkers.rules.qos import qos2_flows
from spark_checkers.rules.registry import BACKLOGS, IN_FLIGHT, MESSAGES, QOS2_FLOWS, SHARED, SLOTS, STORED_IDS
from spark_checkers.rules.whitebox import packet_id_gaps
from spark_checkers.shared import has_shared, shared_table
from spark_checkers.timeline import Timeline, detail_of, has_mqtt5


@dataclass
class Checks:
    """What ``build`` hands the caller to collect (``collect_all(violations, metrics)``).

    A small check: every violation and metric in those two, one job.  A big check: there, only what reads the
    open messages (the loss rules, the owed metrics); the rest (``delivered_checks``) is collected in the aside
    thread as soon as the per-subscriber table is materialised, ``early`` its future (counts, witnesses,
    metric rows), which the caller merges.  Why: the open messages and the online trims are a chain of small
    jobs with driver work between them, and the final query waited for them with the cores half idle; begun
    beside them, its planning and its stages fill those moments.

    ``parts()`` and ``all_metrics()`` are the fallback when a collect breaks: (the invariants it decides, its
    violations) per rule, to name the rule that broke without running it again, and the metrics; both wait for
    ``early`` first, whose rule groups they include."""
    violations: Any = None
    metrics: Any = None
    lost: Any = None  # the loss rules' violations (in ``violations``)
    early: Future | None = None
    groups: list = field(default_factory=list)  # the rule groups of delivered_checks
    delivery_metrics: Any = None  # a big check's metrics of delivered_checks (collected by ``early``)

    def settle(self) -> None:
        if self.early is not None:
            wait([self.early])

    def parts(self) -> list[tuple[tuple[str, ...], Any]]:
        self.settle()
        return [p for g in self.groups for p in g.separate()] + [(LOSS_INVARIANTS, self.lost)]

    def all_metrics(self):
        self.settle()
        return self.metrics if self.delivery_metrics is None else self.delivery_metrics.unionByName(self.metrics)


def build(spark, runs: list[RunSpec], events, prepare: Callable[[], tuple[dict[str, Timeline], dict[str, list[str]]]],
          cached: list, small: bool = False, aside: ThreadPoolExecutor | None = None) -> Checks:
    """Every Spark-side violation as (run_id, invariant, sort_key, witness JSON), plus metric rows (``Checks``).
    Every DataFrame it materialises is appended to ``cached``; the caller unpersists them once ``aside`` is done:
    the caller's one-thread executor for the work ``build`` begins beside its own (a big check's ``Checks.early``
    runs on there after ``build`` returns; without one, ``build`` uses its own and waits).  ``prepare()`` gives the
    runs' timelines and published topics (the caller's scans of the small rows); it runs while the publishes,
    which need neither, are materialised.

    Five tables are materialised: the publishes (one row per message), the deliveries with their packet-id
    slots (moved once, by subscriber), one row per delivered (subscriber, message), one narrow row per
    (subscriber, message) that matched one of the subscriber's filters, and the never-delivered candidates
    among those (open_messages: few).  The fourth serves the owed candidates and the publish lookup of the
    per-message rules alike; none of them moves the deliveries again.  A big check materialises up to three
    more, as small as what is out of the ordinary: the stream neighbours of the reordered publishers' messages,
    the queue values of the queued messages, each merged back into its table by the sorted join key, and what
    the messages delivered more than once tell in order (with_after_ack), looked up by broadcast."""
    if aside is not None:
        return _build(spark, runs, events, prepare, cached, small, aside)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ordeal-check") as own:
        return _build(spark, runs, events, prepare, cached, small, own)


def _build(spark, runs, events, prepare, cached, small, aside):
    """``build``, with ``aside``: one thread that materialises a table while this one goes on to the next.

    Why two jobs at once: each job leaves cores idle while it is planned and submitted, between its stages,
    and at its last tasks; and the driver builds the side tables with both cores idle.  With a second job
    submitted, Spark's scheduler gives those moments to its tasks (the first job's tasks still go first).
    Only tables that do not read each other run side by side: the publishes beside the caller's scans of the
    small rows, the side tables and the packet-id slots; the stream neighbours beside the per-subscriber table;
    in a big check, the collect of every rule that reads no open message (``Checks.early``) beside the open
    messages, the online trims and the loss rules' collect.  A failure in the
    aside thread is raised by ``result()``, here or in the caller (``Checks.early``)."""
    mode = freeze_mode(small)
    checks = Checks()
    constant = {"run_id": runs[0].run_id} if len(runs) == 1 else {}

    def freeze(df, label: str, run: dict | None = None, counts: dict[str, int] | None = None):
        """``run``: the one run's row of the runs table, stored as constants, the structs flattened; ``counts``:
        filled in by the materialising job (freeze_table)."""
        return freeze_table(df, cached, label, mode, {**constant, **(run or {})}, flatten=bool(run), counts=counts)

    events = encode_events(events)
    publishing = aside.submit(freeze, publishes(events, constant), "publishes")
    timelines, topics = prepare()
    with timed("side tables"):
        runs_df, clients_df, match_df = side_tables(spark, runs, timelines, topics)
    runs_b, clients_b, match_b = F.broadcast(runs_df), F.broadcast(clients_df), F.broadcast(match_df)
    by = subscriber_partitioning(runs)
    v5 = mqtt5(timelines)
    slots = freeze(delivery_slots(events, clients_df, by, v5).join(runs_b.select("run_id", "t_origin", "tol_us"), "run_id"),
                   "slots")
    if not v5:  # what the SLOTS rules read of MQTT 5: none (literals above the table, not stored in it)
        slots = slots.select("*", F.lit(None).cast("int").alias("packet_size"),
                             F.lit(None).cast("long").alias("max_packet_size"))
    flows = flow_groups(events, timelines, clients_b, runs_b, by)
    pub = publishing.result()
    deliveries = slots.drop("t_origin", "tol_us")
    claims = subscriber_claims(pub, slots, match_b, by)
    # Two ways to the same two tables.  A big check sorts and windows only the rows that need it (the reordered
    # publishers' messages, the queued ones) and merges the few results back, unmaterialised; a small check
    # (a run's history) windows every row and materialises one table each: its cost is the driver's, per job
    # and per join, not the rows'.
    if small:
        per_message = deliveries_per_message(deliveries, constant)
        # Sorted by the join key within each subscriber's partition, so every later join with it only merges.
        dsm = freeze(with_stream_neighbour(per_message).sortWithinPartitions(*SUBSCRIBER_MESSAGE), "per_message")
        per_message = dsm
        table = freeze(per_subscriber_message(subscriber_rows(claims, dsm, runs_b, clients_b)), "per_subscriber_message")
        flows = [*flows, *shared_groups_of(spark, pub, dsm, timelines, topics, runs_b, clients_b)]
    else:
        # Counted as they are materialised: a claimed delivered message for each delivered one means that no
        # delivery needs a lookup in the publishes (delivered_messages), and two count jobs less.
        delivered = {"rows": 0}
        per_message = with_after_ack(
            freeze(message_deliveries(deliveries, constant).sortWithinPartitions(*SUBSCRIBER_MESSAGE), "per_message",
                   counts=delivered), deliveries, constant, freeze)
        if per_message is None:  # many messages delivered more than once: every message's deliveries in order
            # (the first table stays cached, unread, until the check releases it: memory, not time)
            per_message = freeze(deliveries_per_message(deliveries, constant).sortWithinPartitions(*SUBSCRIBER_MESSAGE),
                                 "per_message", counts=delivered)
        neighbouring = aside.submit(freeze, stream_neighbours(per_message), "stream neighbours")
        claimed = {"n_deliveries": 0}
        rows = freeze(subscriber_rows(claims, per_message, runs_b, clients_b), "per_subscriber_message",
                      runs_df.drop("fault_times", "fault_spans").first().asDict() if constant else None, claimed)
        table = per_subscriber_message(rows, freeze(backlog_queues(rows), "backlog queues"))
        dsm = per_message.join(neighbouring.result(), list(SUBSCRIBER_MESSAGE), "left")
        # Every rule and metric that reads no open message is collected in the aside thread, begun now: its
        # planning and its stages fill the moments the open messages and the online trims (small jobs, driver
        # work between them) leave the cores idle, instead of waiting for them (Checks).
        flows = [*flows, *shared_groups_of(spark, pub, per_message, timelines, topics, runs_b, clients_b)]
        checks.early = aside.submit(_early_checks, checks, table, dsm, pub, slots, runs_b, clients_b, match_b,
                                    claimed["n_deliveries"] == delivered["rows"], flows)
    gaps = freeze(with_cause(open_messages(table, clients_b)), "open messages")
    with timed("online trims"):
        trimmed = online_trims(gaps, table).collect()
    if trimmed:  # few rows (never-delivered messages), and none in a run that lost nothing
        keys = local_frame(spark, [(r["run_id"], r["client"], r["publisher"], r["pub_seq"], int(r["peak"]))
                                   for r in trimmed], "run_id string, client long, publisher long, "
                                                      "pub_seq long, trim_peak long")
        gaps = gaps.join(F.broadcast(keys), ["run_id", "client", "publisher", "pub_seq"], "left")
        online = F.col("trim_peak").isNotNull()
        gaps = freeze(gaps.withColumn("legally_trimmed", F.col("legally_trimmed") | online)
                      .withColumn("owed", F.col("owed") & ~online).drop("trim_peak"), "online trims")
    checks.lost, checks.metrics = owed_checks(table, gaps)
    checks.violations = checks.lost
    if small:
        violations, metrics, checks.groups = delivered_checks(table, dsm, pub, slots, runs_b, clients_b, match_b,
                                                              all_claimed=False, flows=flows)
        checks.violations, checks.metrics = violations.unionByName(checks.lost), metrics.unionByName(checks.metrics)
    return checks


def _early_checks(checks, table, dsm, pub, slots, runs_b, clients_b, match_b, all_claimed: bool, flows: list):
    """A big check's aside work: ``delivered_checks``, its rule groups and metrics kept in ``checks`` (for the
    caller's fallback), collected (``collect_all``)."""
    violations, metrics, checks.groups = delivered_checks(table, dsm, pub, slots, runs_b, clients_b, match_b,
                                                          all_claimed, flows)
    checks.delivery_metrics = metrics
    with timed("violations + metrics of the deliveries"):
        return collect_all(violations, metrics)


def delivered_checks(table, dsm, pub, slots, runs_b, clients_b, match_b, all_claimed: bool, flows: list = ()):
    """Every rule and metric that reads no open message (open_messages): the rules over each delivery's packet-id
    slot, over each delivered message, over each settled backlog and over the stored-id sequence (each table's
    rules from the registry), those of ``flows`` (``flow_groups``), and the publish and delivery metrics.
    (violations, metrics, the rule groups.)"""
    with timed("publish lookup of deliveries"):
        dp, unmatched = delivered_messages(table, dsm, pub, runs_b, all_claimed)
    # Black box: each settled backlog once, by its first-ranked row.
    backlogs = table.filter(F.col("is_cand")).filter(F.col("in_backlog") & (F.col("rank") == 1))
    groups = [catalog.group(SLOTS, slots), catalog.group(MESSAGES, message_table(dp, runs_b, match_b, clients_b)),
              catalog.group(BACKLOGS, backlogs),
              catalog.group(STORED_IDS, packet_id_gaps(slots, table, clients_b, runs_b)), *flows]
    # The delivery metrics read what the per-subscriber table already holds of each claimed delivered message
    # (a scan of its cache), not the per-message join the rules read: that join would run a second time.
    metric_cols = ("run_id", "t_first", "t_invoke", "n_deliveries", "n_resends", "n_after_ack", "t_origin", "bucket_us")
    delivered = table.filter(F.col("n_deliveries").isNotNull()).select(*metric_cols)
    if unmatched is not None:
        delivered = delivered.unionByName(unmatched.select(*metric_cols))
    return (reduce(lambda a, b: a.unionByName(b), [g.combined() for g in groups]),
            delivery_metrics(pub, slots, delivered, runs_b), groups)


def mqtt5(timelines: dict[str, Timeline]) -> bool:
    """Whether any run of the batch had an MQTT 5 connection: else the deliveries carry nothing of MQTT 5 to read."""
    return any(has_mqtt5(t) for t in timelines.values())


def shared_groups_of(spark, pub, per_message, timelines: dict[str, Timeline], topics: dict[str, list[str]], runs_b,
                     clients_b) -> list:
    """The rule group over the shared groups' messages (spark_checkers/shared.py), where the batch has a shared
    subscription: else none, and nothing of it is planned."""
    if not has_shared(timelines):
        return []
    return [catalog.group(SHARED, shared_table(spark, pub, per_message, timelines, topics, runs_b, clients_b))]


def flow_groups(events, timelines: dict[str, Timeline], clients_b, runs_b, by: tuple[str, ...]) -> list:
    """The rule groups over the subscriber-side flows, each read from the events (one scan, unmaterialised: its
    group is its only reader) and only where the small side says the batch can break it: the PUBLISH packets of
    the connections that declared a Receive Maximum, the QoS 2 flows when a subscription was granted QoS 2."""
    groups = []
    limits = [row for t in timelines.values() for rows in t.connects.values() for row in rows if row.get("protocol") == 5]
    if any("receive_maximum" in detail_of(row) for row in limits):
        groups.append(catalog.group(IN_FLIGHT, in_flight(events, clients_b, runs_b, by)))
    if any(s.granted_qos == 2 for t in timelines.values() for s in t.subscriptions):
        groups.append(catalog.group(QOS2_FLOWS, qos2_flows(events, clients_b, runs_b, by)))
    return groups
