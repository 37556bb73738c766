"""Streaming offsets and micro-batch planning, as pure functions.

An offset is `{ledger_id: next_entry}`: every entry below next_entry has been handed to Spark.
Spark stores offsets as JSON, whose object keys are strings, so the wire form is
`{"<ledger_id>": next_entry}`. A micro-batch from offset `start` to `end` covers, per ledger,
entries `[start.get(id, first_entry), end[id] - 1]`; ledgers that appear only in `end` were found
after the stream started and are read from `first_entry` (the startEntry option, default 0).
"""
from __future__ import annotations

from typing import Any, Mapping

from .plan import EntryRange, split

Offset = dict[int, int]


def to_json(offset: Mapping[int, int]) -> dict[str, int]:
    """The JSON-safe form Spark checkpoints."""
    return {str(k): int(v) for k, v in sorted(offset.items())}


def from_json(data: Mapping[str, Any] | None) -> Offset:
    """Parse a checkpointed offset; raises ValueError on anything that is not {id: next_entry}."""
    out: Offset = {}
    for k, v in (data or {}).items():
        try:
            ledger_id, next_entry = int(k), int(v)
        except (TypeError, ValueError):
            raise ValueError(f"bad pybk stream offset entry {k!r}: {v!r} "
                             "(expected {\"<ledger id>\": <next entry id>})") from None
        if ledger_id < 0 or next_entry < 0:
            raise ValueError(f"bad pybk stream offset entry {k!r}: {v!r} (negative)")
        out[ledger_id] = next_entry
    return out


def admit(start: Mapping[int, int], available: Mapping[int, int], max_entries: int | None,
          first_entry: int = 0) -> Offset:
    """The end offset of the next micro-batch.

    available: per ledger, the next entry id that is not yet readable (LAC + 1, or last entry + 1
    of a closed ledger, capped by endEntry + 1). Ledgers missing from start begin at first_entry.
    With max_entries, the budget is shared fairly (water-filling): every ledger with new entries
    gets an equal share, and what a ledger cannot use goes to the others, so one busy ledger does
    not starve the rest. The result never moves a ledger backwards and never drops one.
    """
    begin = {lid: start.get(lid, first_entry) for lid in set(start) | set(available)}
    want = {lid: max(0, available.get(lid, begin[lid]) - begin[lid]) for lid in begin}
    if max_entries is None:
        grant = want
    else:
        grant = {lid: 0 for lid in begin}
        budget = max_entries
        hungry = sorted(lid for lid, n in want.items() if n > 0)
        while budget > 0 and hungry:
            share = max(1, budget // len(hungry))
            still = []
            for lid in hungry:
                if budget == 0:
                    break
                take = min(share, want[lid] - grant[lid], budget)
                grant[lid] += take
                budget -= take
                if grant[lid] < want[lid]:
                    still.append(lid)
            hungry = still
    end: Offset = {}
    for lid in begin:
        if lid in start or grant[lid] > 0:
            end[lid] = begin[lid] + grant[lid]
    return end


def batch_ranges(start: Mapping[int, int], end: Mapping[int, int], per_partition: int,
                 first_entry: int = 0) -> list[EntryRange]:
    """Entry ranges (partitions) of the micro-batch (start, end]."""
    out: list[EntryRange] = []
    for lid in sorted(end):
        lo = start.get(lid, first_entry)
        hi = end[lid] - 1
        if hi >= lo:
            out.extend(split(lid, lo, hi, per_partition))
    return out


def total(start: Mapping[int, int], end: Mapping[int, int], first_entry: int = 0) -> int:
    """Entries in the micro-batch (start, end]."""
    return sum(max(0, end[lid] - start.get(lid, first_entry)) for lid in end)
