"""The column groups the big tables share (the keys and the columns each table gives), and ``sql``, how every
higher-order function of the checks is written."""

from __future__ import annotations

from pyspark.sql import functions as F

from contracts.history_schema import Kind

# Columns no checker reads (wall clocks, payload size): not even decoded for the small rows.
UNREAD_COLUMNS = ("t_wall_us", "send_wall_us", "payload_size")


PUB_KINDS = (Kind.PUBLISH_INVOKE, Kind.PUBLISH_ACK, Kind.PUBLISH_FAIL, Kind.PUBLISH_INDETERMINATE)


# What a message's deliveries tell of the MQTT 5 delivery rules (job/messages.py: ``v5_aggregates``), each name with its
# type: a delivery table without the columns they read (an MQTT 3.1.1 batch) gives them null.
V5_AGGREGATES = (("min_qos", "tinyint"), ("max_remaining", "bigint"), ("no_remaining_t", "bigint"),
                 ("no_remaining_packet_id", "int"), ("min_props", "bigint"), ("max_props", "bigint"),
                 ("min_sids", "bigint"), ("max_sids", "bigint"), ("min_n_sids", "int"), ("max_n_sids", "int"),
                 ("min_sid", "bigint"), ("max_sid", "bigint"), ("min_retain", "int"), ("max_retain", "int"))


# Column groups of the per-(subscriber, message) tables: the key, what ``publishes`` gives per message, what
# ``deliveries_per_message`` (+ stream neighbour) gives per delivered message, the per-run scalars.
SUBSCRIBER_MESSAGE = ("run_id", "client", "publisher", "pub_seq")


PUBLISH_COLUMNS = ("topic", "n_invoke", "t_invoke", "pub_qos", "expiry_s", "pub_hash", "pub_node", "t_ack", "t_fail",
                   "t_indet", "pub_protocol", "pub_props", "pub_retain")


MESSAGE_COLUMNS = ("n_deliveries", "first", "last", "t_last", "min_hash", "max_hash", "qos", "first_ack_seq", "first_ack_t",
                   "n_resends", "n_after_ack", "redelivery", "twice", "implied_deadline", "any_unacked",
                   *(name for name, _ in V5_AGGREGATES))


DELIVERY_COLUMNS = (*MESSAGE_COLUMNS, "prev_max")


RUN_SCALARS = ("limit", "ttl_us", "tol_us", "bucket_us", "t_origin", "slack_us")


DELIVERED_COLUMNS = (*SUBSCRIBER_MESSAGE, *PUBLISH_COLUMNS, *DELIVERY_COLUMNS, *RUN_SCALARS)


FIRST_FIELDS = ("seq", "t", "packet_id", "dup", "conn", "node", "topic", "qos", "epoch", "stored", "retain")  # ``first``


LAST_FIELDS = ("seq", "t", "packet_id", "dup", "node")  # ``last``: a message's first and last delivery


AFTER_ACK_COLUMNS = ("n_after_ack", "redelivery", "twice")  # what only a message's deliveries in order give


QUEUE_COLUMNS = ("rank", "legally_trimmed", "misplaced", "n_pipeline_w", "n_backlog", "n_settled_delivered", "n_settled",
                 "max_rank_delivered_kept", "trimmed_delivered", "wrongly_kept_rank")


def sql(text: str):
    """A column from SQL text: how every higher-order function (filter, exists, transform) is written here.

    Why not a Python lambda: PySpark names a lambda's variable afresh on every call (``x_41``, ``x_42``, ... from
    one counter per JVM or Connect client), and the name is written into the generated Java.  So every check
    generated ~20 classes that differed from the last check's only in those names, compiled by Janino and then
    by the JIT anew every time.  A SQL lambda keeps its name as written, so a check's generated code is the same
    every time and, with a code cache that holds a whole check (session.CODEGEN_CACHE_ENTRIES), a warm server
    compiles nothing (a warm 100k-event check: 415 compilations with the default cache, 20 with the big one, 0
    with both; tests/checkers/test_checker_codegen.py)."""
    return F.expr(text)
