"""The one validation vocabulary of every configuration table (a scenario's sections, the self-test matrix,
the [topology] table): typed reads with ranges and choices, unknown keys rejected, and every error naming the
source file, the ``[table] key``, the offending value and what is allowed."""

from __future__ import annotations

import math
from typing import Any

from contracts.errors import UsageError


class Section:
    """Reads one TOML table, remembering which keys were used so unknown ones can be rejected.

    ``error`` is the UsageError subclass it raises (a subclass of Section sets it: ScenarioError for a
    scenario, MatrixError for a self-test matrix, ...).  ``label`` is how messages name the table:
    ``[name]`` unless given (an array of tables names its element, e.g. ``[[entry]] #2``)."""

    error: type[UsageError] = UsageError

    def __init__(self, source: str, name: str, table: Any, *, label: str | None = None):
        self.source = source
        self.name = name
        self.label = label if label is not None else f"[{name}]"
        if table is None:
            table = {}
        if not isinstance(table, dict):
            raise self.error(f"{source}: {self.label} must be a table, got {table!r}")
        self.table = table
        self.used: set[str] = set()

    def fail(self, key: str, value: Any, expected: str) -> UsageError:
        return self.error(f"{self.source}: {self.label} {key} = {value!r}: {expected}")

    def _get(self, key: str, default: Any, required: bool) -> Any:
        self.used.add(key)
        if key not in self.table:
            if required:
                raise self.error(f"{self.source}: {self.label} {key} is required")
            return default
        return self.table[key]

    def string(self, key: str, default: str = "", *, choices: tuple[str, ...] = (), required: bool = False,
               non_empty: bool = False) -> str:
        value = self._get(key, default, required)
        if not isinstance(value, str):
            raise self.fail(key, value, "must be a string")
        if choices and value not in choices:
            raise self.fail(key, value, f"must be one of {', '.join(repr(c) for c in choices)}")
        if non_empty and not value.strip():
            raise self.fail(key, value, "must not be empty")
        return value

    def integer(self, key: str, default: int = 0, *, minimum: int | None = None, maximum: int | None = None,
                required: bool = False) -> int:
        value = self._get(key, default, required)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, value, "must be an integer")
        check_range(self, key, value, minimum, maximum)
        return value

    def number(self, key: str, default: float = 0.0, *, minimum: float | None = None,
               maximum: float | None = None, above: float | None = None, required: bool = False) -> float:
        value = self._get(key, default, required)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.fail(key, value, "must be a finite number")
        check_range(self, key, value, minimum, maximum)
        if above is not None and not value > above:
            raise self.fail(key, value, f"must be > {above}")
        return float(value)

    def boolean(self, key: str, default: bool) -> bool:
        value = self._get(key, default, False)
        if not isinstance(value, bool):
            raise self.fail(key, value, "must be true or false")
        return value

    def fraction(self, key: str, default: float) -> float:
        return self.number(key, default, minimum=0.0, maximum=1.0)

    def strings(self, key: str, default: tuple[str, ...] = ()) -> tuple[str, ...]:
        value = self._get(key, list(default), False)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail(key, value, "must be a list of strings")
        return tuple(value)

    def number_range(self, key: str, default: tuple[float, float], *, minimum: float = 0.0) -> tuple[float, float]:
        value = self._get(key, list(default), False)
        if (not isinstance(value, list) or len(value) != 2
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
            raise self.fail(key, value, "must be a list of two numbers [low, high]")
        low, high = float(value[0]), float(value[1])
        if low < minimum or high < low:
            raise self.fail(key, value, f"must satisfy {minimum} <= low <= high")
        return (low, high)

    def weights(self, key: str, default: dict[str, float], allowed: tuple[str, ...] | None,
                what: str) -> dict[str, float]:
        """A table of name -> non-negative weight, at least one weight > 0 (unless empty is allowed)."""
        value = self._get(key, default, False)
        if not isinstance(value, dict):
            raise self.fail(key, value, f"must be a table of {what} = weight")
        for name, weight in value.items():
            if allowed is not None and name not in allowed:
                known = ", ".join(allowed) if allowed else "(none)"
                raise self.fail(f"{key}.{name}", weight, f"unknown {what} {name!r}; allowed: {known}")
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not (
                    math.isfinite(weight) and weight >= 0):
                raise self.fail(f"{key}.{name}", weight, "weight must be a number >= 0")
        return {name: float(weight) for name, weight in value.items()}

    def allow(self, *keys: str) -> None:
        """Keys that are valid here though this reader did not read them (one of two alternatives)."""
        self.used.update(keys)

    def raw_table(self, key: str) -> dict[str, Any]:
        value = self._get(key, {}, False)
        if not isinstance(value, dict):
            raise self.fail(key, value, "must be a table")
        return value

    def finish(self) -> None:
        unknown = sorted(set(self.table) - self.used)
        if unknown:
            raise self.error(
                f"{self.source}: {self.label} unknown key {unknown[0]!r}; allowed keys: "
                f"{', '.join(sorted(self.used))}")


def check_range(section: Section, key: str, value: float, minimum: float | None, maximum: float | None) -> None:
    if minimum is not None and value < minimum:
        raise section.fail(key, value, f"must be >= {minimum}" + (f" and <= {maximum}" if maximum is not None else ""))
    if maximum is not None and value > maximum:
        raise section.fail(key, value, f"must be <= {maximum}" + (f" and >= {minimum}" if minimum is not None else ""))


def nonzero_total(section: Section, key: str, weights: dict[str, float]) -> None:
    if not weights or sum(weights.values()) <= 0:
        raise section.fail(key, weights, "needs at least one entry with a weight > 0")
