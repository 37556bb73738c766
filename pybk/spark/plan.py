"""Read planning as pure functions: which entry ranges of which ledgers a query must read.

`Bounds` is the box of (ledger_id, entry_id) that the filters Spark pushed down admit.
`narrow()` turns pushed filters into bounds and says which filters Spark must still evaluate;
`window()` is one ledger's entries that the options (startingOffsets/endingOffsets, startEntry/
endEntry) select; `plan_ranges()` cuts each ledger's window inside the bounds into partitions of at
most `entries_per_partition` entries (fewer when `minPartitions` asks for more partitions).
Because entries outside the bounds are never planned, a pushed `entry_id BETWEEN a AND b` is never
read from a bookie at all, and `entry_id IN (5, 4000)` reads two entries, not 3,996.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Iterable, Sequence

from .options import LATEST, LedgerSelection, Positions


@dataclass(frozen=True)
class Bounds:
    """Inclusive limits on ledger ids and entry ids; None means unbounded above."""

    ledger_lo: int = 0
    ledger_hi: int | None = None
    ledger_in: frozenset[int] | None = None
    entry_lo: int = 0
    entry_hi: int | None = None
    entry_in: frozenset[int] | None = None

    @property
    def empty(self) -> bool:
        if self.ledger_hi is not None and self.ledger_hi < self.ledger_lo:
            return True
        if self.entry_hi is not None and self.entry_hi < self.entry_lo:
            return True
        if self.entry_in is not None and not self.entry_runs(self.entry_lo, self.entry_hi):
            return True
        return self.ledger_in is not None and not any(self.admits_ledger(i) for i in self.ledger_in)

    def admits_ledger(self, ledger_id: int) -> bool:
        return (ledger_id >= self.ledger_lo
                and (self.ledger_hi is None or ledger_id <= self.ledger_hi)
                and (self.ledger_in is None or ledger_id in self.ledger_in))

    def with_entries(self, lo: int, hi: int | None) -> "Bounds":
        """These bounds narrowed to entries [lo, hi]."""
        return replace(self, entry_lo=max(self.entry_lo, lo), entry_hi=_min(self.entry_hi, hi))

    def entry_runs(self, first: int, last: int | None) -> list[tuple[int, int | None]]:
        """The entries of [first, last] these bounds admit, as inclusive runs: one run, or with an
        IN list one run per group of consecutive values."""
        lo, hi = max(first, self.entry_lo), _min(last, self.entry_hi)
        if hi is not None and hi < lo:
            return []
        if self.entry_in is None:
            return [(lo, hi)]
        runs: list[tuple[int, int | None]] = []
        for v in sorted(v for v in self.entry_in if v >= lo and (hi is None or v <= hi)):
            if runs and runs[-1][1] == v - 1:
                runs[-1] = (runs[-1][0], v)
            else:
                runs.append((v, v))
        return runs


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
    exactly by planning (an IN on entry_id plans one range per value); anything else is returned
    untouched.
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
            ids = frozenset(values)
            if col == "ledger_id":
                bounds = replace(bounds, ledger_in=ids if bounds.ledger_in is None else bounds.ledger_in & ids)
            else:
                bounds = replace(bounds, entry_in=ids if bounds.entry_in is None else bounds.entry_in & ids)
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


def split_all(ranges: Iterable[EntryRange], per_partition: int, min_partitions: int = 1) -> list[EntryRange]:
    """Ranges cut into partitions of at most per_partition entries, and into at least
    min_partitions partitions when there are that many entries (like Kafka's minPartitions: a
    smaller size for every range, so big ranges are cut most)."""
    ranges = [r for r in ranges if r.count > 0]
    entries = sum(r.count for r in ranges)
    size = per_partition
    if min_partitions > 1 and entries:
        size = max(1, min(per_partition, entries // min_partitions))
    return [p for r in ranges for p in split(r.ledger_id, r.first, r.last, size)]


def window(starting: Positions, ending: Positions, ledger_id: int, last_readable: int) -> tuple[int, int]:
    """Entries [first, last] of a ledger that a batch read selects: from its starting position to
    before its ending position, within what is readable (last_readable + 1 is latest)."""
    next_readable = last_readable + 1
    first = starting.resolve(ledger_id, next_readable)
    cap = ending.cap(ledger_id)
    end = next_readable if cap is None else min(cap, next_readable)
    return first, end - 1


def plan_ranges(readable: Iterable[tuple[int, int]], bounds: Bounds, per_partition: int,
                starting: Positions = Positions(), ending: Positions = Positions(LATEST),
                min_partitions: int = 1) -> list[EntryRange]:
    """Partitions for a batch read.

    readable: (ledger_id, last readable entry id) pairs; the last readable entry is the last
    entry of a closed ledger or the LAC of an open one (-1 when it has none).
    """
    if bounds.empty:
        return []
    ranges: list[EntryRange] = []
    for ledger_id, last_readable in sorted(readable):
        if not bounds.admits_ledger(ledger_id):
            continue
        first, last = window(starting, ending, ledger_id, last_readable)
        ranges.extend(EntryRange(ledger_id, lo, last if hi is None else hi)
                      for lo, hi in bounds.entry_runs(first, last))
    return split_all(ranges, per_partition, min_partitions)
