"""Ordeal's checkers: from a stored run's history to a verdict per invariant, report.json, junit.xml and
report.html (docs/invariants.md).

How the rooms relate, top down:
- api.py: ``check_runs`` opens runs (loader.py), builds each run's timeline from its small rows (timeline.py,
  guarantees.py), runs one Spark check for all of them, decides (verdicts.py) and assembles the reports
  (reports.py, html.py, junit.py; context.py lays out the history around each witness).
- build.py wires one check: the tables of job/ materialised in order, the rules of rules/ over each of them;
  collect.py collects the violations and metrics in one job.
- rules/: the rule families and their explanations, registered in rules/registry.py and gathered by
  rules/catalog.py (and the log oracle, rules/logs.py).
- job/: the shared Spark machinery the rules read (codes, tables, queues, materialising, metrics).
- engine/: running Spark, not checking (the settings, the session, the shared Connect server).
- synthetic.py and bulk_history.py write histories with planted anomalies (tests, the warm-up, benchmarks);
  defaults.py holds the warm-up's sizes for the command line.
"""

CHECKER_VERSION = "0.1.0"


def check_run(run_dir, spark_master=None, **kwargs):
    """Check a stored run; writes report.json, junit.xml, report.html; returns the exit code 0 / 1 / 2."""
    # Imported here: importing the package (the CLI, spark_checkers.rules.logs) must not import pyspark.
    from spark_checkers.api import check_run as _check_run

    return _check_run(run_dir, spark_master, **kwargs)
