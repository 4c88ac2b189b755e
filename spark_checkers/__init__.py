"""PySpark invariant checkers over Ordeal histories, verdicts and reports (see docs/invariants.md)."""

CHECKER_VERSION = "0.1.0"


def check_run(run_dir, spark_master=None, **kwargs):
    """Check a stored run; writes report.json, junit.xml, report.html; returns the exit code 0 / 1 / 2."""
    from spark_checkers.api import check_run as _check_run

    return _check_run(run_dir, spark_master, **kwargs)
