"""Open a stored run: the scenario's guarantees and a validated history, or the reasons it cannot be read.

Everything here is pure Python + pyarrow and reads only footers and the manifest, so a broken history is
diagnosed in milliseconds, with the file and what is wrong, before Spark is asked to scan anything.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

import pyarrow.parquet as pq

from contracts.history_schema import (
    COLUMNS,
    EVENT_SCHEMA,
    MANIFEST_NAME,
    PARQUET_META_KEY,
    READABLE_VERSIONS,
    SCHEMA_VERSION,
    V2_COLUMNS,
)
from spark_checkers.guarantees import Guarantees


@dataclass(frozen=True)
class RunInput:
    run_id: str
    run_dir: Path
    guarantees: Guarantees | None
    parts: tuple[str, ...]  # readable part files, in manifest order
    manifest: dict
    fatal: tuple[str, ...]  # nothing can be decided: every invariant is unknown
    incomplete: tuple[str, ...]  # decidable, but absences prove nothing (manifest incomplete, ...)
    history_hash: str
    rows: int = 0  # rows in the readable parts, per their footers

    @property
    def readable(self) -> bool:
        return not self.fatal


def local_run_dir(location: str | Path) -> Path:
    """The run directory as a local path, from a path or a ``file://`` URI.

    The checker process itself reads the manifest, the scenario and the Parquet footers (to diagnose a broken
    history before Spark scans anything) and writes the reports next to them, so the run directory must be
    on a file system this process can open: a local path, or a ``file://`` URI (on a Spark cluster, a mount
    every executor sees under the same path).  Any other scheme is refused with this explanation."""
    if isinstance(location, Path):
        return location
    parsed = urlparse(location)
    if len(parsed.scheme) <= 1:  # no scheme (a plain path; one letter would be a Windows drive)
        return Path(location)
    if parsed.scheme != "file":
        raise ValueError(f"{location}: run directories on {parsed.scheme}:// are not supported; the checker reads "
                         "the manifest and scenario and writes the reports itself, so give a local path or a "
                         "file:// URI (on a cluster: a shared mount every Spark executor sees at the same path)")
    if parsed.netloc not in ("", "localhost"):
        raise ValueError(f"{location}: file:// URI with host {parsed.netloc!r}; expected file:///absolute/path "
                         "(the host part must be empty or localhost)")
    return Path(unquote(parsed.path))


def spark_uri(part: str) -> str:
    """A part file as the absolute URI handed to Spark, so that no cluster resolves it against another
    default file system (fs.defaultFS may be HDFS there).  Not percent-encoded: Hadoop takes the string as
    is (``%20`` would name a different file)."""
    return part if "://" in part else "file://" + str(Path(part).resolve())


def open_run(run_dir: str | Path, run_id: str | None = None) -> RunInput:
    run_dir = local_run_dir(run_dir)
    fatal: list[str] = []
    guarantees = None
    scenario_path = run_dir / "scenario.json"
    try:
        guarantees = Guarantees.from_scenario(json.loads(scenario_path.read_text()), str(scenario_path))
    except FileNotFoundError:
        fatal.append(f"{scenario_path} is missing: the declared guarantees are needed to decide anything")
    except json.JSONDecodeError as error:
        fatal.append(f"{scenario_path} is not valid JSON: {error}")
    except ValueError as error:
        fatal.append(str(error))
    history_dir = run_dir / "history"
    parts, manifest, history_fatal, incomplete, digest = validate_history(history_dir)
    rows = sum(pq.ParquetFile(p).metadata.num_rows for p in parts) if not history_fatal else 0
    return RunInput(run_id or run_dir.name, run_dir, guarantees, parts, manifest, tuple(fatal + history_fatal),
                    tuple(incomplete), digest, rows)


def validate_history(history_dir: Path) -> tuple[tuple[str, ...], dict, list[str], list[str], str]:
    """(parts, manifest, fatal problems, incompleteness reasons, sha256 of manifest + parts)."""
    fatal: list[str] = []
    incomplete: list[str] = []
    manifest_path = history_dir / MANIFEST_NAME
    digest = hashlib.sha256()
    try:
        raw = manifest_path.read_bytes()
        manifest = json.loads(raw)
        digest.update(raw)
    except FileNotFoundError:
        return (), {}, [f"{manifest_path} is missing: not a history directory"], [], ""
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        return (), {}, [f"{manifest_path} is not valid JSON: {error}"], [], ""
    if not isinstance(manifest, dict):
        return (), {}, [f"{manifest_path}: expected a JSON object"], [], ""
    version = manifest.get("schema_version")
    if version not in READABLE_VERSIONS:
        fatal.append(f"{manifest_path}: schema_version {version!r} is not one this checker knows "
                     f"(expected one of {', '.join(map(str, READABLE_VERSIONS))})")
    if manifest.get("complete") is not True:
        incomplete.append(f"{manifest_path}: complete={manifest.get('complete')!r} "
                          f"(end_reason={manifest.get('end_reason')!r}): the recorder did not finish")
    names = manifest.get("parts")
    if not isinstance(names, list) or not names:
        fatal.append(f"{manifest_path}: 'parts' must be a non-empty list of part file names")
        names = []
    parts: list[str] = []
    total_rows = 0
    for name in names:
        path = history_dir / str(name)
        try:
            parquet = pq.ParquetFile(path)
        except FileNotFoundError:
            fatal.append(f"{path}: listed in the manifest but missing")
            continue
        except Exception as error:  # pyarrow raises ArrowInvalid / OSError for truncated or corrupt files
            fatal.append(f"{path}: not a readable Parquet file ({type(error).__name__}: {error})")
            continue
        schema = parquet.schema_arrow
        meta = schema.metadata or {}
        part_version = meta.get(PARQUET_META_KEY)
        readable = {str(v).encode() for v in READABLE_VERSIONS}
        if part_version is not None and part_version not in readable:
            fatal.append(f"{path}: Parquet metadata {PARQUET_META_KEY.decode()}={part_version.decode()!r}, "
                         f"expected one of {', '.join(map(str, READABLE_VERSIONS))}")
        # A version 1 part has none of the version 2 columns: Spark reads them as null.
        optional = V2_COLUMNS if part_version == b"1" or version == 1 else ()
        missing = [column for column in COLUMNS if column not in schema.names and column not in optional]
        if missing:
            fatal.append(f"{path}: missing column(s) {missing}; the history schema v{SCHEMA_VERSION} needs all of "
                         f"contracts/history_schema.py COLUMNS")
        for column in COLUMNS:
            if column in schema.names:
                expected = EVENT_SCHEMA.field(column).type
                found = schema.field(column).type
                if found != expected:
                    fatal.append(f"{path}: column {column!r} has type {found}, expected {expected}")
        total_rows += parquet.metadata.num_rows
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        parts.append(str(path))
    declared = manifest.get("rows")
    if not fatal and isinstance(declared, int) and declared != total_rows:
        incomplete.append(f"{manifest_path}: manifest says {declared} rows, the parts hold {total_rows}")
    return tuple(parts), manifest, fatal, incomplete, digest.hexdigest()
