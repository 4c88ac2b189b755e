"""The self-test matrix (selftest/matrix.toml): its entries, the false-alarm and black-box tables, read and
validated with the one validation vocabulary (contracts/validation.py)."""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contracts.errors import UsageError
from contracts.validation import Section

TIERS = ("smoke", "full")
REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MATRIX = REPO_ROOT / "selftest" / "matrix.toml"
NEED_FRACTION = 0.8  # an entry's default: ceil(0.8 x seeds) must catch the defect (4 of 5)
TABLES = ("entry", "false_alarm", "blackbox")


class MatrixError(UsageError):
    """The matrix file is wrong; the message names the file, the key and what is expected."""


class _MatrixSection(Section):
    error = MatrixError


@dataclass(frozen=True)
class MatrixEntry:
    """One defect in one tier: its scenario, the seeds it is run with, the invariants that must fail and how
    many of the seeds must catch it (``need``; default 4 of 5, i.e. ceil(0.8 x seeds))."""

    defect: str
    scenario: Path
    seeds: tuple[int, ...]
    expect: tuple[str, ...]
    tier: str
    need: int = 1

    @property
    def seed(self) -> int:
        return self.seeds[0]


@dataclass(frozen=True)
class FalseAlarmSpec:
    scenarios: tuple[Path, ...] = ()
    repeat: int = 3
    seed_start: int = 100


@dataclass(frozen=True)
class BlackboxSpec:
    scenarios: tuple[Path, ...] = ()
    seed: int = 1


@dataclass(frozen=True)
class Matrix:
    source: str
    entries: tuple[MatrixEntry, ...]
    false_alarm: FalseAlarmSpec = FalseAlarmSpec()
    blackbox: BlackboxSpec = BlackboxSpec()

    def uncovered(self, catalog: Mapping[str, Any]) -> tuple[str, ...]:
        """Catalog defects without a full-tier entry (the detection matrix proper)."""
        covered = {e.defect for e in self.entries if e.tier == "full"}
        return tuple(name for name in catalog if name not in covered)


def load_matrix(path: str | Path = DEFAULT_MATRIX, root: Path = REPO_ROOT) -> Matrix:
    path = Path(path)
    try:
        document = tomllib.loads(path.read_text())
    except FileNotFoundError as error:
        raise MatrixError(f"{path}: no such matrix file") from error
    except tomllib.TOMLDecodeError as error:
        raise MatrixError(f"{path}: not valid TOML: {error}") from error
    return parse_matrix(document, source=str(path), root=root)


def parse_matrix(document: Mapping[str, Any], *, source: str, root: Path = REPO_ROOT,
                 catalog: Mapping[str, Any] | None = None, invariant_ids: tuple[str, ...] | None = None,
                 check_files: bool = True) -> Matrix:
    if catalog is None:
        from reference_broker.defects import CATALOG as catalog
    if invariant_ids is None:
        from contracts.invariants import IDS as invariant_ids
    unknown_tables = sorted(set(document) - set(TABLES))
    if unknown_tables:
        raise MatrixError(f"{source}: unknown table(s) {', '.join(unknown_tables)}; allowed: {', '.join(TABLES)}")
    raw_entries = document.get("entry", [])
    if not isinstance(raw_entries, list) or not raw_entries:
        raise MatrixError(f"{source}: needs at least one [[entry]] table (defect, scenario, seed, expect, tier)")
    entries: list[MatrixEntry] = []
    seen: set[tuple[str, str]] = set()
    for index, raw in enumerate(raw_entries):
        entry = _entry(_MatrixSection(source, "entry", raw, label=f"[[entry]] #{index + 1}"), root, catalog,
                       invariant_ids, check_files)
        if (entry.defect, entry.tier) in seen:
            raise MatrixError(f"{source}: [[entry]] #{index + 1} (defect {entry.defect!r}): defect "
                              f"{entry.defect!r} has a second {entry.tier} entry; one entry per defect and tier")
        seen.add((entry.defect, entry.tier))
        entries.append(entry)

    false_alarm = FalseAlarmSpec()
    if "false_alarm" in document:
        section = _MatrixSection(source, "false_alarm", document["false_alarm"])
        repeat = section.integer("repeat", 3, minimum=1)
        seed_start = section.integer("seed_start", 100, minimum=0)
        false_alarm = FalseAlarmSpec(_scenario_list(section, root, check_files), repeat, seed_start)
        section.finish()
    blackbox = BlackboxSpec()
    if "blackbox" in document:
        section = _MatrixSection(source, "blackbox", document["blackbox"])
        seed = section.integer("seed", 1, minimum=0)
        blackbox = BlackboxSpec(_scenario_list(section, root, check_files), seed)
        section.finish()
    return Matrix(source, tuple(entries), false_alarm, blackbox)


def _entry(section: Section, root: Path, catalog: Mapping[str, Any], invariant_ids: tuple[str, ...],
           check_files: bool) -> MatrixEntry:
    defect = section.string("defect", required=True, non_empty=True)
    section.label += f" (defect {defect!r})"
    if defect not in catalog:
        raise section.fail("defect", defect, f"not in the catalog; known: {', '.join(catalog)}")
    tier = section.string("tier", "full", choices=TIERS)
    text = section.string("scenario", required=True, non_empty=True)
    scenario = _scenario_path(section, "scenario", text, root, check_files)
    if tier == "full" and scenario.parent != root / "scenarios":
        # the question users ask: does a scenario they run catch it, not one written for the defect
        raise section.fail("scenario", text, "a full-tier entry must name a shipped scenario (scenarios/*.toml, "
                                             "the nightly set), not a selftest-only one")
    seeds = _seeds(section)
    need = section.integer("need", math.ceil(NEED_FRACTION * len(seeds)))
    if not 1 <= need <= len(seeds):
        raise section.fail("need", need, f"must be a whole number from 1 to the number of seeds ({len(seeds)})")
    expect = section.strings("expect")
    if not expect:
        raise section.fail("expect", list(expect), "must be a non-empty list of invariant ids")
    bad = [x for x in expect if x not in invariant_ids]
    if bad:
        raise section.fail("expect", list(expect), f"unknown invariant id(s) {', '.join(bad)}; known: "
                                                   f"{', '.join(invariant_ids)}")
    section.finish()
    return MatrixEntry(defect, scenario, seeds, expect, tier, need)


def _seeds(section: Section) -> tuple[int, ...]:
    """``seed = N`` or ``seeds = [N, ...]``, exactly one of them."""
    has_seed, has_seeds = "seed" in section.table, "seeds" in section.table
    section.allow("seed", "seeds")
    if has_seed == has_seeds:
        raise section.error(f"{section.source}: {section.label}: give either seed = N or seeds = [N, ...] (got "
                            f"{'both' if has_seed else 'neither'})")
    if has_seed:
        return (section.integer("seed", minimum=0),)
    seeds = section.table["seeds"]
    if not isinstance(seeds, list) or not seeds or not all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in seeds) or len(set(seeds)) != len(seeds):
        raise section.fail("seeds", seeds, "must be a non-empty list of distinct whole numbers >= 0")
    return tuple(seeds)


def _scenario_path(section: Section, key: str, text: str, root: Path, check_files: bool) -> Path:
    path = Path(text)
    path = path if path.is_absolute() else root / path
    if check_files and not path.is_file():
        raise section.fail(key, text, f"no such file ({path})")
    return path


def _scenario_list(section: Section, root: Path, check_files: bool) -> tuple[Path, ...]:
    scenarios = section.strings("scenarios")
    if not all(scenarios):
        raise section.fail("scenarios", list(scenarios), "must be a list of scenario file paths")
    return tuple(_scenario_path(section, "scenarios", s, root, check_files) for s in scenarios)


def relative_to_repo(path: Path) -> str:
    """``path`` relative to the repository (as the rows and selftest.json name scenarios), else as given."""
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def defect_catalog() -> Mapping[str, Any]:
    """The reference broker's defect catalog (what the matrix covers)."""
    from reference_broker.defects import CATALOG

    return CATALOG
