"""The machinery every rule family shares, one room per idea: how big a check plans for (sizing.py), the
history as Spark reads it (events.py), name codes (codes.py), the column groups (columns.py), the small
broadcast tables (side_tables.py), the big tables of the message side (messages.py) and of the subscriber side
(subscribers.py), the open-message queues (queues.py), materialising (materialise.py), the metrics
(metrics.py) and step timing (timing.py).  Nothing here names an invariant's rule: rules/ reads these tables,
build.py wires both into one check."""
