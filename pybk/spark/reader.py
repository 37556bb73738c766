"""Batch and streaming readers of the `pybk` data source (driver side: planning and offsets).

Spark pickles a reader for its tasks before it asks it for partitions, so what planning learns
per ledger (the password that opens it, from selectors in option `passwords`) travels in the
partition (`ReadPartition`), and `read()` hands it to the scan as `opts.password_for(ledger_id)`.
"""
from __future__ import annotations

import logging
from typing import Any, Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition

from . import offsets as offs
from .discovery import Discovered, discover
from .errors import PybkSparkError, cause_first, cause_first_iter
from .options import ReadOptions
from .plan import Bounds, EntryRange, narrow, plan_ranges
from .runtime import is_no_such_ledger, run
from .scan import LedgerPartition, read_partition

try:  # Spark 4.2+: admission control and Trigger.AvailableNow
    from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadLimit, ReadMaxRows,
                                                  SupportsTriggerAvailableNow)
except ImportError:  # pragma: no cover - older Spark
    ReadLimit = ReadAllAvailable = ReadMaxRows = None  # type: ignore[assignment,misc]

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        pass

log = logging.getLogger("pybk.spark")


class ReadPartition(LedgerPartition):
    """Entries [first, last] of one ledger, with the password planning found opens it."""

    def __init__(self, ledger_id: int, first: int, last: int, password: bytes):
        super().__init__(ledger_id, first, last)
        self.password = password


def partitions_of(ranges: Sequence[EntryRange], passwords: dict[int, bytes],
                  opts: ReadOptions) -> list[InputPartition]:
    """Spark partitions for these ranges, each with its ledger's password."""
    return [ReadPartition(r.ledger_id, r.first, r.last,
                          passwords[r.ledger_id] if r.ledger_id in passwords else opts.password_for(r.ledger_id))
            for r in ranges]


def read_ledger_partition(opts: ReadOptions, part: InputPartition) -> Iterator[pa.RecordBatch]:
    """One partition's batches (executor side). A ledger deleted since planning is data loss:
    an error naming it (failOnDataLoss, the default), else the rest of its range is skipped with a
    warning."""
    if isinstance(part, ReadPartition):
        opts = opts.with_password(part.ledger_id, part.password)
    try:
        yield from read_partition(opts, part)
    except Exception as exc:
        if not is_no_such_ledger(exc) or not isinstance(part, LedgerPartition):
            raise
        loss = offs.Loss(part.ledger_id, offs.LossKind.DELETED, part.first)
        if opts.fail_on_data_loss:
            raise PybkSparkError(loss.message()) from None
        log.warning("pybk: %s; skipped (failOnDataLoss=false)", loss.message().split(";")[0])


class LedgerBatchReader(DataSourceReader):
    """Batch scan: one partition per entry range; ledger_id/entry_id filters cut the ranges."""

    def __init__(self, opts: ReadOptions):
        self.opts = opts
        self.bounds = Bounds()

    def pushFilters(self, filters: list[Any]) -> Iterator[Any]:
        """Take the ledger_id/entry_id comparisons into the plan; hand the rest back to Spark."""
        self.bounds, remaining = narrow(self.bounds, filters)
        return iter(remaining)

    def partitions(self) -> Sequence[InputPartition]:
        with cause_first():
            found = run(discover(self.opts, self.bounds, strict=True))
            ranges = plan_ranges(found.readable.items(), self.bounds, self.opts.entries_per_partition,
                                 self.opts.starting, self.opts.ending, self.opts.min_partitions)
            log.info("pybk scan of %d ledgers: %d partitions", len(found.readable), len(ranges))
            return partitions_of(ranges, found.passwords, self.opts)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return cause_first_iter(read_ledger_partition(self.opts, partition))


class LedgerStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Follows the selected ledgers (and new ones inside the selection) with offsets
    {ledger_id: next_entry}; maxEntriesPerTrigger bounds each micro-batch via ReadMaxRows.

    Each discovery is checked for data loss against the offset the next batch starts from: a
    ledger of that offset that is gone, or readable less far than before, fails the query
    (failOnDataLoss) or is dropped from the offsets with a warning."""

    def __init__(self, opts: ReadOptions):
        self.opts = opts
        self.bounds = Bounds()
        self._target: dict[int, int] | None = None
        self._last_end: dict[str, int] | None = None
        self._seen: dict[int, int] = {}
        self._passwords: dict[int, bytes] = {}

    def _discover(self) -> dict[int, int]:
        """Per ledger, the next entry that is not readable yet, capped by endingOffsets/endEntry."""
        found: Discovered = run(discover(self.opts, self.bounds, strict=False))
        self._passwords.update(found.passwords)
        out = {}
        for lid, last in found.readable.items():
            cap = self.opts.ending.cap(lid)
            out[lid] = last + 1 if cap is None else min(last + 1, cap)
        return out

    def _available(self, available: dict[int, int]) -> dict[int, int]:
        if self._target is not None:
            return {lid: min(n, self._target[lid]) for lid, n in available.items() if lid in self._target}
        return available

    def _without_losses(self, start: dict[int, int], available: dict[int, int]) -> dict[int, int]:
        """start without the ledgers whose entries were lost (or an error, with failOnDataLoss)."""
        losses = offs.data_loss(start, available, self._seen)
        for lid, n in available.items():
            self._seen[lid] = max(n, self._seen.get(lid, 0))
        if losses and self.opts.fail_on_data_loss:
            raise PybkSparkError(losses[0].message()
                                 + (f" ({len(losses) - 1} more ledger(s) lost)" if len(losses) > 1 else ""))
        for loss in losses:
            log.warning("pybk: %s; skipped (failOnDataLoss=false)", loss.message().split(";")[0])
            self._seen[loss.ledger_id] = available.get(loss.ledger_id, 0)
        gone = {loss.ledger_id for loss in losses if loss.kind is offs.LossKind.DELETED}
        return {lid: n for lid, n in start.items() if lid not in gone}

    def initialOffset(self) -> dict:
        with cause_first():
            available = self._discover()
            for lid, n in available.items():
                self._seen[lid] = max(n, self._seen.get(lid, 0))
            available = self._available(available)
            return offs.to_json({lid: self.opts.starting.resolve(lid, n) for lid, n in available.items()})

    def getDefaultReadLimit(self) -> Any:
        if self.opts.max_entries_per_trigger is not None and ReadMaxRows is not None:
            return ReadMaxRows(self.opts.max_entries_per_trigger)
        return ReadAllAvailable() if ReadAllAvailable is not None else None

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        with cause_first():
            if start is None:  # Spark < 4.2 calls latestOffset() without arguments
                start = self._last_end if self._last_end is not None else self.initialOffset()
                max_entries = self.opts.max_entries_per_trigger
            elif ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
                max_entries = limit.max_rows
            else:
                max_entries = None
            available = self._discover()
            begin = self._without_losses(offs.from_json(start), available)
            end = offs.admit(begin, self._available(available), max_entries, self.opts.starting)
            self._last_end = offs.to_json(end)
            return self._last_end

    def prepareForTriggerAvailableNow(self) -> None:
        with cause_first():
            self._target = None
            self._target = self._discover()

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        with cause_first():
            if any(lid not in self._passwords for lid in offs.from_json(end)):
                self._discover()  # e.g. replaying a batch after a restart: learn the passwords
            ranges = offs.batch_ranges(offs.from_json(start), offs.from_json(end),
                                       self.opts.entries_per_partition, self.opts.starting,
                                       self.opts.min_partitions)
            return partitions_of(ranges, self._passwords, self.opts)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return cause_first_iter(read_ledger_partition(self.opts, partition))

    def commit(self, end: dict) -> None:
        pass
