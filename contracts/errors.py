"""The one base class of input that cannot be used.

A scenario, plan, self-test matrix, topology table, stored run directory or option that cannot be used is a
``UsageError`` (or a subclass naming what it is about).  Its message names the file, the key or packet, the
value and what was expected, so the user knows what to change.  The CLI maps every one to exit 3
(``contracts.exit_codes.EXIT_USAGE``) in one place, ``ordeal/cli.py``: nothing ran or was checked, so it is
neither a violation (1) nor an undecided run (2).
"""

from __future__ import annotations


class UsageError(ValueError):
    """Input that cannot be used; the message says where and what to change."""
