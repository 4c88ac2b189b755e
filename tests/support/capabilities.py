"""What a test does when this machine lacks a capability it needs (root, the private network namespace,
nftables): it skips on a developer's machine, and FAILS under ``CI=true`` (docs/testing standards: a CI
machine that cannot test isolation must not report green by skipping those tests)."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

CI = os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def missing_capability(reason: str, *, allow_module_level: bool = False) -> NoReturn:
    if CI:
        pytest.fail(f"CI=true and a required capability is missing: {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=allow_module_level)
