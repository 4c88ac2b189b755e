"""The checker rules, one module per family (order, durability, expiry, duplicates, liveness, limits, whitebox,
losses, meta), each adding its rules and their explanations to the registry (registry.py); catalog.py
imports every family and answers the build's and the report's questions; columns.py and words.py hold what
several families share.  logs.py is the log oracle: the log invariants' rules, in plain
Python over the nodes' logs rather than Spark.

This package file imports nothing, so that ``spark_checkers.rules.logs`` is importable without pyspark; the
Spark families are imported through catalog.py, by the build and the report."""
