"""Shards: ``--shard K/N`` splits one nightly's work over N machines, deterministically, so that the shards'
work is disjoint and together is the whole; ``ordeal merge`` (ordeal/merge.py) puts their outputs together.

Explore (seeds): shard K of N runs the seeds s with ``s % N == K - 1``.  Its first seed is the first such seed
at or after the start (``--seed-start``, or one after the highest seed of the scenario in the corpus), and each
next seed is N further on.  So for any start the shards' seed sets are disjoint and their union is every seed
from the start on.

Self-test (runs): the tier's runs (``ordeal.selftest.tier.plan_jobs``, the same list on every shard: the same
matrix and options) are grouped into units, and whole units go to shards:
  - a defect's entry: every seed of the entry with the defect on, plus the correct-broker runs of its scenario
    and seeds that no entry before it in the plan already brought (a scenario + seed shared by several entries
    is run once, with the first of them);
  - each false-alarm repeat and each black-box run: a unit of its own.
The units are dealt in plan order, each to the shard with the fewest runs so far (ties: the lowest K).  That is
index order, balanced by run count: deterministic for a given plan, disjoint, covering, for every N.  A shard
may get no unit at all when N exceeds the number of units.  A defect's seeds never straddle shards, so a
shard's per-defect fraction (caught on 4 of 5) is the whole entry's; a catch the correct broker shares on
another shard is discounted when the shards are merged (``discount_shared_failures`` on the merged rows).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from contracts.errors import UsageError

SHARD_FORM = "K/N, e.g. 2/4"
_SHARD_TEXT = re.compile(r"\s*(\d+)\s*/\s*(\d+)\s*")


class ShardError(UsageError):
    """A bad --shard value or shard record; the message names it and the expected form."""


@dataclass(frozen=True)
class Shard:
    """Shard ``k`` of ``n`` (1 <= k <= n).  ``Shard(1, 1)`` is everything."""

    k: int = 1
    n: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.k, bool) or isinstance(self.n, bool) or not isinstance(self.k, int) \
                or not isinstance(self.n, int) or not (self.n >= 1 and 1 <= self.k <= self.n):
            raise ShardError(f"--shard {self.k}/{self.n}: expected {SHARD_FORM} (1 <= K <= N)")

    @classmethod
    def parse(cls, text: str, option: str = "--shard") -> Shard:
        match = _SHARD_TEXT.fullmatch(text or "")
        if not match:
            raise ShardError(f"{option} {text!r}: expected {SHARD_FORM} (1 <= K <= N)")
        k, n = int(match[1]), int(match[2])
        if not (n >= 1 and 1 <= k <= n):
            raise ShardError(f"{option} {text!r}: expected {SHARD_FORM} (1 <= K <= N, N >= 1)")
        return cls(k, n)

    def __str__(self) -> str:
        return f"{self.k}/{self.n}"

    @property
    def whole(self) -> bool:
        return self.n == 1

    # ------------------------------------------------------------------------------------------- seeds
    def owns_seed(self, seed: int) -> bool:
        return seed % self.n == self.k - 1

    def first_seed(self, start: int) -> int:
        """The first seed of this shard at or after ``start``."""
        return start + (self.k - 1 - start) % self.n

    def seeds_from(self, start: int) -> Iterator[int]:
        """This shard's seeds from ``start`` on, in order (explore's sequence)."""
        seed = self.first_seed(start)
        while True:
            yield seed
            seed += self.n

    def to_dict(self) -> dict[str, int]:
        return {"k": self.k, "n": self.n}

    @classmethod
    def from_dict(cls, record: Any, where: str) -> Shard:
        """A stored shard record ({"k": K, "n": N}); ShardError naming ``where`` when it is not one."""
        if not isinstance(record, dict) or not all(
                isinstance(record.get(key), int) and not isinstance(record.get(key), bool) for key in ("k", "n")):
            raise ShardError(f"{where}: shard record {record!r}: expected {{\"k\": K, \"n\": N}} ({SHARD_FORM})")
        try:
            return cls(record["k"], record["n"])
        except ShardError as error:
            raise ShardError(f"{where}: shard record {record!r}: expected {SHARD_FORM} (1 <= K <= N)") from error


WHOLE = Shard(1, 1)


class _JobLike(Protocol):
    role: str
    label: str
    scenario: Any
    seed: int
    defect: str | None


def selftest_units(jobs: Sequence[_JobLike]) -> list[list[_JobLike]]:
    """The self-test's units (see the module docstring), in plan order; every job in exactly one unit."""
    units: list[list[_JobLike]] = []
    entry_unit: dict[str, list[_JobLike]] = {}
    first_entry: dict[tuple[Any, int], str] = {}  # (scenario, seed) -> the first entry with it, in plan order
    for job in jobs:
        if job.role == "defect":
            key = str(job.defect)
            if key not in entry_unit:
                entry_unit[key] = []
                units.append(entry_unit[key])
            entry_unit[key].append(job)
            first_entry.setdefault((job.scenario, job.seed), key)
    for job in jobs:
        if job.role == "defect":
            continue
        owner = first_entry.get((job.scenario, job.seed)) if job.role == "correct" else None
        if owner is not None:
            entry_unit[owner].append(job)
        else:
            units.append([job])
    return units


def assign_units(weights: Sequence[int], n: int) -> list[int]:
    """The shard index (0-based) of each unit: in order, to the shard with the least weight so far (ties: the
    lowest index)."""
    loads = [0] * n
    owners = []
    for weight in weights:
        index = min(range(n), key=lambda i: (loads[i], i))
        loads[index] += weight
        owners.append(index)
    return owners


def shard_jobs(jobs: Sequence[_JobLike], shard: Shard) -> list[_JobLike]:
    """This shard's jobs, in plan order."""
    if shard.whole:
        return list(jobs)
    units = selftest_units(jobs)
    owners = assign_units([len(unit) for unit in units], shard.n)
    mine = {id(job) for unit, owner in zip(units, owners, strict=True) if owner == shard.k - 1 for job in unit}
    return [job for job in jobs if id(job) in mine]


def shard_record(shard: Shard, planned: Sequence[_JobLike]) -> dict[str, Any]:
    """What a shard's selftest.json records: K, N and the labels of the whole plan, in plan order (the merge
    checks that every shard planned the same runs and that together they ran each one once)."""
    return {**shard.to_dict(), "planned": [job.label for job in planned]}
