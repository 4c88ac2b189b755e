"""The open-message queues: each queued (subscriber, message)'s place in its offline window's backlog and what
the backlog says as a whole (``backlog_queues``, ``queue_windows``), whether each claim was owed
(``per_subscriber_message``), and the owed messages never delivered with their streams' neighbours and the
moments a queue can have trimmed them (``open_messages``, ``online_trims``)."""

from __future__ import annotations

from pyspark.sql import Window
from pyspark.sql import functions as F

from spark_checkers.job.columns import QUEUE_COLUMNS, SUBSCRIBER_MESSAGE, sql
from spark_checkers.timeline import NEVER


def backlog_queues(rows):
    """Per queued (subscriber, message) of ``subscriber_rows`` (``in_backlog``), its place in its offline window's
    backlog and what the backlog as a whole says (QUEUE_COLUMNS), sorted by the join key.

    Why only the queued rows: these windows sort the rows by arrival and pass over them three times; over every
    row of a 10 M event history (nearly all delivered online) they took half the per-subscriber table's time, for
    values only a queued row reads."""
    queued = rows.filter(F.col("in_backlog")).select(*SUBSCRIBER_MESSAGE, "is_cand", "backlog", "policy", "limit",
                                                     "t_arr", "delivered", "kept_after", "settled")
    return queue_windows(queued).select(*SUBSCRIBER_MESSAGE, *QUEUE_COLUMNS).sortWithinPartitions(*SUBSCRIBER_MESSAGE)


def queue_windows(t):
    """QUEUE_COLUMNS over rows of ``subscriber_rows``, each backlog (an offline window of a subscriber) alone.  A
    row not queued (``backlog`` -1) gets values that mean nothing; ``per_subscriber_message`` replaces them."""
    # Every window below is partitioned by is_cand too: rows that were never owed (another session's filter,
    # a failed publish) share the subscriber's partition but must not take part in its queue or stream.
    # Why rank newest-first: while offline the broker keeps only the newest `limit` of the backlog.  Messages
    # that arrived in the same microsecond are ranked by publisher code (codes.py: CODED), then sequence: an order
    # the history cannot give, fixed so that every check ranks them alike.
    queue = Window.partitionBy("run_id", "client", "is_cand", "backlog").orderBy(
        F.col("t_arr").desc(), F.col("publisher").desc(), F.col("pub_seq").desc())
    whole = Window.partitionBy("run_id", "client", "is_cand", "backlog")
    # --- queue-policy rules (declared by the target: drop_oldest, drop_newest, reject, none) ---------------
    # "rank" counts from the end of the backlog the declared policy keeps: newest-first for drop_oldest (TBMQ),
    # oldest-first for drop_newest (n - newest-first rank + 1: one sort serves both).  Only a drop policy
    # trims legally; under reject or none every trimmed message is simply lost.
    newest_first = F.row_number().over(queue)
    t = t.select("*", F.when(F.col("policy") == "drop_newest", F.count(F.lit(1)).over(whole) - newest_first + 1)
                 .otherwise(newest_first).alias("rank"))
    t = t.select("*", (drops() & (F.col("rank") > F.col("limit"))).alias("legally_trimmed"))
    t = t.select(
        "*", F.sum((~F.col("settled")).cast("int")).over(whole).alias("n_pipeline_w"),
        F.count(F.lit(1)).over(whole).alias("n_backlog"),
        F.sum((F.col("kept_after") & F.col("settled")).cast("int")).over(whole).alias("n_settled_delivered"),
        F.sum(F.col("settled").cast("int")).over(whole).alias("n_settled"),
        F.max(F.when(F.col("kept_after") & ~F.col("legally_trimmed"), F.col("rank"))).over(whole).alias(
            "max_rank_delivered_kept"))
    t = t.select(
        "*",
        # Kept although older than the limit even if every in-pipeline message missed the queue.
        F.max((F.col("kept_after") & F.col("legally_trimmed") & F.col("settled")
               & (F.col("rank") > F.col("limit") + F.col("n_pipeline_w"))).cast("int")).over(whole).alias(
            "trimmed_delivered"),
        # The oldest message kept although the limit (plus the pipeline) was newer than it: the trim kept the
        # wrong end of this backlog (read below: a newer one trimmed beside it was not trimmed legally).
        F.max(F.when(F.col("kept_after") & F.col("legally_trimmed") & F.col("settled")
                     & (F.col("rank") > F.col("limit") + F.col("n_pipeline_w")), F.col("rank"))).over(whole).alias(
            "wrongly_kept_rank"))
    # Never delivered, past the limit by rank but within the limit plus the pipeline, while the broker kept a
    # message beyond both (newer than it under drop_oldest, older under drop_newest): the queue held the wrong
    # end, and a correct queue would have kept this one (the pipeline's messages can have missed the queue and
    # arrived live, so the newest limit + pipeline are what a correct broker delivers).  Those further out would
    # have been trimmed either way: the policy rule counts the messages on the wrong side of the policy, no more
    # (trim_newest with the newest 20 still in the pipeline at the reconnect, limit 20: the oldest 20 kept, the
    # pipeline's 20 arrived, 26 between them never sent, of which 20 a correct queue keeps; p2p-limit-trim-3).
    misplaced = F.coalesce(F.col("legally_trimmed") & ~F.col("delivered") & (F.col("rank") < F.col("wrongly_kept_rank"))
                           & (F.col("rank") <= F.col("limit") + F.col("n_pipeline_w")), F.lit(False))
    t = t.select("*", misplaced.alias("misplaced")).withColumn("legally_trimmed",
                                                               F.col("legally_trimmed") & ~F.col("misplaced"))
    return t


def per_subscriber_message(rows, queues=None):
    """``subscriber_rows`` with their ``backlog_queues`` values (a row not queued: no rank, no backlog, nothing
    trimmed) and, for the owed candidates (``is_cand``), whether they are owed.  Both sides are sorted by the
    join key within the subscriber's partition: a merge, no rows move and none is sorted again.

    Without ``queues`` (a small check): the queue windows over every row, a row not queued masked to the same
    values.  For a run's history the sort costs nothing, and a join and a job less cost the driver less."""
    if queues is None:
        t = queue_windows(rows)
        t = t.select(*[c for c in t.columns if c not in QUEUE_COLUMNS],
                     *[F.when(F.col("in_backlog"), F.col(c)).alias(c) for c in QUEUE_COLUMNS])
    else:
        t = rows.join(queues, list(SUBSCRIBER_MESSAGE), "left")
    zero = ("n_pipeline_w", "n_settled_delivered", "n_settled", "trimmed_delivered")
    t = t.select(*[c for c in t.columns if c not in ("legally_trimmed", "misplaced", *zero)],
                 *[F.coalesce(c, F.lit(False)).alias(c) for c in ("legally_trimmed", "misplaced")],
                 *[F.coalesce(c, F.lit(0)).alias(c) for c in zero])
    # What a delivered row owes is settled here; a never-delivered one's (trimmed later, carried, why lost) is
    # settled by open_messages, which reads its stream's neighbours.
    t = t.select("*", owed_flag().alias("owed"))
    return t if queues is not None else t.sortWithinPartitions(*SUBSCRIBER_MESSAGE)


def owed_flag():
    """Whether the subscriber was owed a candidate: not undeliverable, not expired, not legally trimmed."""
    return ~F.col("undeliverable") & ~F.col("expired_legally") & ~F.col("legally_trimmed")


def drops():
    """Whether the run's declared queue policy trims (drop_oldest, drop_newest); under reject or none it never does."""
    return F.col("policy").isin("drop_oldest", "drop_newest")


def open_messages(table, clients_b):
    """The never-delivered candidates of ``table`` (``is_cand``, not delivered), each with its stream's nearest
    deliveries, when it can have been trimmed, whether it was carried into the next backlog, whether it is owed
    (why an owed one was lost, and where in its stream, the loss rules add: rules/losses.py, ``with_cause``).
    None of this is read for a delivered row.

    Why only the streams with such a row: a stream's neighbours take two sorts of every row of the stream, one
    each way.  Over every row they cost a 10 M event history a sort and two window passes of 2.5 M wide rows;
    over the streams with a gap they cost what the gaps are."""
    stream_key = ["run_id", "client", "publisher"]
    cands = table.filter(F.col("is_cand"))
    with_gap = cands.filter(~F.col("delivered")).select(*stream_key).distinct()
    t = cands.join(F.broadcast(with_gap), stream_key, "left_semi")
    stream = Window.partitionBy(*stream_key)
    before = stream.orderBy("pub_seq").rowsBetween(Window.unboundedPreceding, -1)
    # Why descending with a growing frame: an "unbounded following" frame is re-aggregated for every row
    # (quadratic per stream); reversed, the nearest later delivery is a running last().
    after = stream.orderBy(F.col("pub_seq").desc()).rowsBetween(Window.unboundedPreceding, -1)
    delivered_seq = F.when(F.col("delivered"), F.col("pub_seq"))
    t = t.select("*", F.last(delivered_seq, ignorenulls=True).over(after).alias("next_delivered"),
                 F.min(F.when(F.col("delivered"), F.col("t_first"))).over(after).alias("later_first_t"))
    t = t.select("*", F.last(delivered_seq, ignorenulls=True).over(before).alias("prev_delivered"),
                 F.max(F.when(F.col("delivered"), F.col("t_last"))).over(before).alias("older_last_t"))
    t = t.filter(~F.col("delivered"))
    # When a never-delivered message can have been trimmed (online_trims): after it arrived and after the last
    # delivery of an older message of its stream (the trim keeps the newest: an older one sent later was still
    # queued), and no later than the first delivery of a newer one (the queue is read in order: had it still
    # been there, it would have gone first).
    t = t.select("*", F.greatest(F.col("t_arr"), F.col("older_last_t")).alias("trim_from"),
                 F.coalesce(F.col("later_first_t"), F.lit(NEVER)).alias("trim_until")).drop("older_last_t")
    # Carried into the next backlog: a message kept in backlog k but not yet delivered when the subscriber went
    # offline again is still in its queue and may be legally trimmed there (as the oldest).  Only when nothing
    # later of the same stream was delivered in between: had the broker sent anything newer, the queue order
    # says this one went first (or was gone).  One window on; a chain beyond is not followed.  Carried into a
    # window that never closes it is NOT excused: the broker had the whole online period (at the end, the
    # drain's quiet period) to deliver it.
    sizes = (cands.filter(F.col("in_backlog")).groupBy("run_id", "client", F.col("backlog").alias("next_idx"))
             .agg(F.max("n_backlog").alias("next_n")))
    t = (t.join(clients_b.select("run_id", "client", "offline"), ["run_id", "client"], "left")
         .withColumn("next_idx", F.col("k.idx") + 1)
         .join(F.broadcast(sizes), ["run_id", "client", "next_idx"], "left"))
    k_next = sql("element_at(filter(coalesce(offline, array()), i -> i.idx = k.idx + 1), 1)")
    waiting = F.col("in_backlog") & ~F.col("legally_trimmed") & ~F.col("misplaced")
    t = t.select("*", F.when(waiting, F.struct(k_next.alias("k"), F.coalesce("next_n", F.lit(0)).alias("n_backlog")))
                 .alias("next_backlog")).drop("offline", "next_idx", "next_n")
    carried = (F.col("next_backlog.k").isNotNull()
               & (F.col("later_first_t").isNull() | (F.col("later_first_t") >= F.col("next_backlog.k.d"))))
    # Carried over, it is the oldest of the next backlog: drop_oldest may trim it there, drop_newest keeps it.
    trimmed_later = F.coalesce(carried & (F.col("policy") == "drop_oldest")
                               & (F.col("next_backlog.n_backlog") >= F.col("limit")), F.lit(False))
    # The window a lost message is blamed on: the one it was carried into, if any (it was dropped there).
    t = t.withColumn("legally_trimmed", F.col("legally_trimmed") | trimmed_later).withColumn(
        "carried_into", F.when(F.coalesce(carried & (F.col("next_backlog.k.c") < NEVER), F.lit(False)), F.struct(
            F.col("next_backlog.k.d").alias("d"), F.col("next_backlog.k.c").alias("c"),
            F.col("next_backlog.n_backlog").alias("n_backlog")))).drop("next_backlog", "later_first_t")
    t = t.withColumn("owed", owed_flag())
    return t


def online_trims(gaps, table):
    """The never-delivered messages a drop-oldest queue trimmed legally at any moment, the subscriber online or
    not: (run_id, client, publisher, pub_seq, peak).  TBMQ trims ``{client}_messages`` to the newest ``limit``
    on every save, whether the client is connected or not (lua/save.lua); a subscriber online behind a slow
    pipeline can have more than the limit queued (p2p-limit-trim seeds 4 and 5, docs/findings.md).

    A message was trimmed legally when, at some moment T in [trim_from, trim_until] (open_messages),
    at least ``limit`` newer messages of the subscriber's queue were there at once.  A newer message counts
    as queued from its publish ack (the earliest it can have been saved) until the subscriber acknowledged it
    (else its last delivery); one never delivered does not count (when it left the queue is unknown, and
    counting it would let one trim excuse the next)."""
    gone = (gaps.filter(F.col("owed") & (F.col("policy") == "drop_oldest")
                         & ~F.col("misplaced")  # its backlog's trim kept the wrong end: no later trim excuses it
                         & (F.col("trim_from") <= F.col("trim_until")))
            .select("run_id", "client", F.col("publisher").alias("m_publisher"), F.col("pub_seq").alias("m_pub_seq"),
                    F.col("t_arr").alias("m_t_arr"), "trim_from", "trim_until", "limit"))
    queued = table.filter(F.col("is_cand") & F.col("delivered")).select(
        "run_id", "client", "publisher", "pub_seq", "t_arr", F.coalesce("first_ack_t", "t_last").alias("t_gone"))
    # "Newer" is the queue order the backlog rank uses: arrival, then publisher and sequence.
    newer = ((F.col("t_arr") > F.col("m_t_arr"))
             | ((F.col("t_arr") == F.col("m_t_arr")) & ((F.col("publisher") > F.col("m_publisher"))
                                                        | ((F.col("publisher") == F.col("m_publisher"))
                                                           & (F.col("pub_seq") > F.col("m_pub_seq"))))))
    pairs = (F.broadcast(gone).join(queued, ["run_id", "client"])
             # t_gone after its entry too: a newer message the subscriber acknowledged before its publisher saw
             # the PUBACK (t_gone < t_arr) was never queued inside the window, and its -1 before its +1 would
             # lower the peak.
             .filter(newer & (F.col("t_gone") > F.greatest("t_arr", "trim_from"))
                     & (F.col("t_arr") <= F.col("trim_until"))))
    m = ["run_id", "client", "m_publisher", "m_pub_seq"]
    # Why a sweep: +1 where a newer message enters the window [trim_from, trim_until], -1 where it leaves (a leave
    # sorts before an enter at the same instant: queued over [t_arr, t_gone)); the running sum's peak is the
    # most newer messages queued at once.
    event = F.explode(F.array(F.struct(F.greatest("t_arr", "trim_from").alias("t"), F.lit(1).alias("d")),
                              F.struct(F.col("t_gone").alias("t"), F.lit(-1).alias("d"))))
    events = pairs.select(*m, "limit", "trim_until", event.alias("e")).filter(F.col("e.t") <= F.col("trim_until"))
    sweep = Window.partitionBy(*m).orderBy("e.t", "e.d").rowsBetween(Window.unboundedPreceding, Window.currentRow)
    peaks = events.select(*m, "limit", F.sum("e.d").over(sweep).alias("n")).groupBy(*m, "limit").agg(
        F.max("n").alias("peak"))
    return peaks.filter(F.col("peak") >= F.col("limit")).select(
        "run_id", "client", F.col("m_publisher").alias("publisher"), F.col("m_pub_seq").alias("pub_seq"), "peak")
