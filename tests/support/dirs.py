"""Directories the tests hand to brokers that drop root."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def searchable_tmp(prefix: str) -> Iterator[Path]:
    """A fresh directory under /tmp that a broker running as another user can reach (mode 0755; pytest's own
    tmp_path is 0700), removed afterwards with everything in it."""
    directory = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    directory.chmod(0o755)
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)
