"""Read planning as pure functions: which entry ranges of which ledgers a query must read.

`Bounds` is the box of (ledger_id, entry_id) a query can see: the options' startEntry/endEntry
intersected with the filters Spark pushed down. `narrow()` turns pushed filters into bounds and
says which filters Spark must still evaluate; `plan_ranges()` cuts each ledger's readable entries
inside the bounds into partitions of at most `entries_per_partition` entries. Because entries
outside the bounds are never planned, a pushed `entry_id BETWEEN a AND b` is never read from a
bookie at all.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Iterable, Sequence

from .options import LedgerSelection


@dataclass(frozen=True)
class Bounds:
    """Inclusive limits on ledger ids and entry ids; None means unbounded above."""

    ledger_lo: int = 0
    ledger_hi: int | None = None
    ledger_in: frozenset[int] | None = None
    entry_lo: int = 0
    entry_hi: int | None = None

    @property
    def empty(self) -> bool:
        if self.ledger_hi is not None and self.ledger_hi < self.ledger_lo:
            return True
        if self.entry_hi is not None and self.entry_hi < self.entry_lo:
            return True
        return self.ledger_in is not None and not any(self.admits_ledger(i) for i in self.ledger_in)

    def admits_ledger(self, ledger_id: int) -> bool:
        return (ledger_id >= self.ledger_lo
                and (self.ledger_hi is None or ledger_id <= self.ledger_hi)
                and (self.ledger_in is None or ledger_id in self.ledger_in))

    def with_entries(self, lo: int, hi: int | None) -> "Bounds":
        """These bounds narrowed to entries [lo, hi]."""
        return replace(self, entry_lo=max(self.entry_lo, lo), entry_hi=_min(self.entry_hi, hi))


def _min(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


def _column(f: Any) -> str | None:
    attr = getattr(f, "attribute", None)
    if isinstance(attr, tuple) and len(attr) == 1 and isinstance(attr[0], str):
        return attr[0].lower()
    return None


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def narrow(bounds: Bounds, filters: Sequence[Any]) -> tuple[Bounds, list[Any]]:
    """Apply pushed-down filters (pyspark.sql.datasource Filter objects) to bounds.

    Returns the narrowed bounds and the filters Spark must still evaluate (the very same
    objects). Comparisons and IN on ledger_id / entry_id with integer literals are enforced
    exactly by planning; IN on entry_id only narrows to its [min, max] and is returned too;
    anything else is returned untouched.
    """
    remaining: list[Any] = []
    for f in filters:
        kind = type(f).__name__
        col = _column(f)
        value = getattr(f, "value", None)
        if col not in ("ledger_id", "entry_id"):
            remaining.append(f)
            continue
        if kind == "In":
            values = tuple(value or ())
            if not values or not all(_is_int(v) for v in values):
                remaining.append(f)
                continue
            if col == "ledger_id":
                ids = frozenset(values)
                both = ids if bounds.ledger_in is None else bounds.ledger_in & ids
                bounds = replace(bounds, ledger_in=both)
            else:
                bounds = bounds.with_entries(min(values), max(values))
                remaining.append(f)
            continue
        if kind == "IsNotNull":
            continue  # the columns are never null
        if not _is_int(value):
            remaining.append(f)
            continue
        lo, hi = {
            "EqualTo": (value, value),
            "EqualNullSafe": (value, value),
            "GreaterThan": (value + 1, None),
            "GreaterThanOrEqual": (value, None),
            "LessThan": (None, value - 1),
            "LessThanOrEqual": (None, value),
        }.get(kind, (False, False))
        if lo is False:
            remaining.append(f)
            continue
        if col == "ledger_id":
            bounds = replace(bounds, ledger_lo=max(bounds.ledger_lo, lo if lo is not None else 0),
                             ledger_hi=_min(bounds.ledger_hi, hi))
        else:
            bounds = bounds.with_entries(lo if lo is not None else 0, hi)
    return bounds, remaining


@dataclass(frozen=True)
class EntryRange:
    """Entries [first, last] (inclusive) of one ledger: the unit of one Spark partition."""

    ledger_id: int
    first: int
    last: int

    @property
    def count(self) -> int:
        return self.last - self.first + 1


def candidate_ledgers(selection: LedgerSelection, bounds: Bounds) -> list[int] | None:
    """The ledger ids to look at without listing the cluster, or None when a listing is needed."""
    if bounds.ledger_in is not None:
        return sorted(i for i in bounds.ledger_in if i in selection and bounds.admits_ledger(i))
    if selection.finite:
        return [i for i in selection.ids() if bounds.admits_ledger(i)]
    return None


def select_ledgers(ids: Iterable[int], selection: LedgerSelection, bounds: Bounds) -> list[int]:
    """Ids from a cluster listing that the selection and bounds admit, sorted."""
    return sorted(i for i in ids if i in selection and bounds.admits_ledger(i))


def split(ledger_id: int, first: int, last: int, per_partition: int) -> list[EntryRange]:
    """Entries [first, last] of one ledger cut into ranges of at most per_partition entries."""
    if per_partition < 1:
        raise ValueError("per_partition must be >= 1")
    return [EntryRange(ledger_id, lo, min(lo + per_partition - 1, last))
            for lo in range(first, last + 1, per_partition)]


def plan_ranges(readable: Iterable[tuple[int, int]], bounds: Bounds,
                per_partition: int) -> list[EntryRange]:
    """Partitions for a batch read.

    readable: (ledger_id, last readable entry id) pairs; the last readable entry is the last
    entry of a closed ledger or the LAC of an open one (-1 when it has none).
    """
    if bounds.empty:
        return []
    out: list[EntryRange] = []
    for ledger_id, last_readable in sorted(readable):
        if not bounds.admits_ledger(ledger_id):
            continue
        first = bounds.entry_lo
        last = last_readable if bounds.entry_hi is None else min(last_readable, bounds.entry_hi)
        if last >= first:
            out.extend(split(ledger_id, first, last, per_partition))
    return out
