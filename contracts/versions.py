"""The schema versions of the run directory's JSON documents, and the one way to read them.

Each document carries ``schema_version`` and has a JSON Schema under docs/schemas/ (validated in
tests/unit/test_schemas.py).  A reader refuses a version it does not know with an error naming the file and
the versions it knows.  Files written before the field existed (no ``schema_version``) have the layout of
version 1 and are read as version 1, so stored runs stay readable.  Bump a version on any incompatible
change and teach its readers first.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from contracts.errors import UsageError
from contracts.history_schema import SCHEMA_VERSION as MANIFEST_VERSION

REPORT_VERSION = 1  # report.json (spark_checkers)
SUMMARY_VERSION = 1  # summary.json (harness/run.py, the check recorded by ordeal/pipeline.py)
SCENARIO_VERSION = 1  # scenario.json (contracts/scenario.py Scenario.to_dict)

KNOWN: dict[str, tuple[int, ...]] = {
    "report.json": (REPORT_VERSION,),
    "summary.json": (SUMMARY_VERSION,),
    "scenario.json": (SCENARIO_VERSION,),
    "manifest.json": (MANIFEST_VERSION,),
}


class SchemaVersionError(UsageError):
    """A document of a schema version this reader does not know."""


def check_version(document: Any, path: str | Path, kind: str | None = None) -> dict[str, Any]:
    """``document`` if its schema_version is one this code knows (missing = 1, the unversioned layout);
    else SchemaVersionError naming the file and the known versions."""
    kind = kind or Path(path).name
    known = KNOWN[kind]
    if not isinstance(document, dict):
        raise SchemaVersionError(f"{path}: expected a JSON object ({kind}), got {type(document).__name__}")
    version = document.get("schema_version", 1)
    if isinstance(version, bool) or version not in known:
        raise SchemaVersionError(f"{path}: schema_version {version!r} is not one this version of Ordeal knows "
                                 f"for {kind} (known: {', '.join(map(str, known))}); read it with the Ordeal "
                                 "that wrote it, or upgrade")
    return document


def read_json(path: str | Path, kind: str | None = None) -> dict[str, Any]:
    """Read a run-directory JSON document and refuse an unknown schema version (SchemaVersionError); OSError
    and json.JSONDecodeError pass through."""
    path = Path(path)
    return check_version(json.loads(path.read_text()), path, kind)


def write_json(path: str | Path, document: dict[str, Any]) -> None:
    """Write a run-directory JSON document the one way they are written (sorted keys, indented, a newline)."""
    Path(path).write_text(json.dumps(document, indent=2, sort_keys=True, default=str) + "\n")
