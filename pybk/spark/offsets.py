"""Streaming offsets and micro-batch planning, as pure functions.

An offset is `{ledger_id: next_entry}`: every entry below next_entry has been handed to Spark.
Spark stores offsets as JSON, whose object keys are strings, so the wire form is
`{"<ledger_id>": next_entry}`. A micro-batch from offset `start` to `end` covers, per ledger,
entries `[start.get(id, first), end[id] - 1]`; ledgers that appear only in `end` were found
after the stream started and are read from their first entry (`Positions.first_of_new`: the
entry id startingOffsets or startEntry gives, else 0), which depends on the options only, so a
replayed batch plans the same ranges.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Mapping

from .options import Positions
from .plan import EntryRange, split_all

Offset = dict[int, int]
First = int | Positions


def _first(first: First, ledger_id: int) -> int:
    return first.first_of_new(ledger_id) if isinstance(first, Positions) else first


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
          first_entry: First = 0) -> Offset:
    """The end offset of the next micro-batch.

    available: per ledger, the next entry id that is not yet readable (LAC + 1, or last entry + 1
    of a closed ledger, capped by endEntry + 1). Ledgers missing from start begin at first_entry.
    With max_entries, the budget is shared fairly (water-filling): every ledger with new entries
    gets an equal share, and what a ledger cannot use goes to the others, so one busy ledger does
    not starve the rest. The result never moves a ledger backwards and never drops one.
    """
    begin = {lid: start[lid] if lid in start else _first(first_entry, lid)
             for lid in set(start) | set(available)}
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
                 first_entry: First = 0, min_partitions: int = 1) -> list[EntryRange]:
    """Entry ranges (partitions) of the micro-batch (start, end]."""
    ranges = [EntryRange(lid, start[lid] if lid in start else _first(first_entry, lid), end[lid] - 1)
              for lid in sorted(end)]
    return split_all(ranges, per_partition, min_partitions)


def total(start: Mapping[int, int], end: Mapping[int, int], first_entry: First = 0) -> int:
    """Entries in the micro-batch (start, end]."""
    return sum(max(0, end[lid] - (start[lid] if lid in start else _first(first_entry, lid))) for lid in end)


class LossKind(enum.StrEnum):
    """How entries a stream was reading became unreadable."""
    DELETED = "deleted"
    SHORTENED = "shortened"


@dataclass(frozen=True)
class Loss:
    """A ledger of a running stream whose entries from `offset` on can no longer be read."""

    ledger_id: int
    kind: LossKind
    offset: int
    readable_to: int | None = None

    def message(self) -> str:
        """What happened, and how to continue (the first line of the query's error)."""
        what = (f"ledger {self.ledger_id} was deleted" if self.kind is LossKind.DELETED else
                f"ledger {self.ledger_id} is now readable only up to entry {self.readable_to} "
                "(it was readable further before)")
        return (f"data loss: {what} while the query was reading it (next entry {self.offset}); "
                "to skip lost data and continue, set option failOnDataLoss=false")


def data_loss(start: Mapping[int, int], available: Mapping[int, int],
              seen: Mapping[int, int]) -> list[Loss]:
    """Ledgers of a stream's offset that can no longer be read as far as before.

    start: the offset the next batch starts from; available: per ledger, the next entry not yet
    readable now (deleted ledgers are absent); seen: per ledger, the furthest `available` seen
    earlier (readable ends only grow, so a smaller one means entries are gone).
    """
    out: list[Loss] = []
    for lid in sorted(start):
        if lid not in available:
            out.append(Loss(lid, LossKind.DELETED, start[lid]))
        elif available[lid] < seen.get(lid, 0):
            out.append(Loss(lid, LossKind.SHORTENED, start[lid], available[lid] - 1))
    return out
