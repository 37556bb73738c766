"""Batch and streaming readers of the `pybk` data source (driver side: planning and offsets)."""
from __future__ import annotations

import logging
from typing import Any, Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition

from . import offsets as offs
from .discovery import discover
from .options import ReadOptions, StartingPosition
from .plan import Bounds, narrow, plan_ranges
from .runtime import run
from .scan import LedgerPartition, read_partition

try:  # Spark 4.2+: admission control and Trigger.AvailableNow
    from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadLimit, ReadMaxRows,
                                                  SupportsTriggerAvailableNow)
except ImportError:  # pragma: no cover - older Spark
    ReadLimit = ReadAllAvailable = ReadMaxRows = None  # type: ignore[assignment,misc]

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        pass

log = logging.getLogger("pybk.spark")


class LedgerBatchReader(DataSourceReader):
    """Batch scan: one partition per entry range; ledger_id/entry_id filters cut the ranges."""

    def __init__(self, opts: ReadOptions):
        self.opts = opts
        self.bounds = Bounds().with_entries(opts.start_entry, opts.end_entry)

    def pushFilters(self, filters: list[Any]) -> Iterator[Any]:
        """Take the ledger_id/entry_id comparisons into the plan; hand the rest back to Spark."""
        self.bounds, remaining = narrow(self.bounds, filters)
        return iter(remaining)

    def partitions(self) -> Sequence[InputPartition]:
        readable = run(discover(self.opts, self.bounds, strict=True))
        ranges = plan_ranges(readable.items(), self.bounds, self.opts.entries_per_partition)
        log.info("pybk scan of %d ledgers: %d partitions", len(readable), len(ranges))
        return [LedgerPartition.of(r) for r in ranges]

    def read(self, partition: LedgerPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.opts, partition)


class LedgerStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Follows the selected ledgers (and new ones inside the selection) with offsets
    {ledger_id: next_entry}; maxEntriesPerTrigger bounds each micro-batch via ReadMaxRows."""

    def __init__(self, opts: ReadOptions):
        self.opts = opts
        self.bounds = Bounds().with_entries(opts.start_entry, opts.end_entry)
        self._target: dict[int, int] | None = None
        self._closed: dict[int, int] = {}
        self._last_end: dict[str, int] | None = None

    def _available(self) -> dict[int, int]:
        """Per ledger, the next entry that is not readable yet (capped by endEntry)."""
        readable = run(discover(self.opts, self.bounds, strict=False, closed=self._closed))
        cap = None if self.opts.end_entry is None else self.opts.end_entry + 1
        out = {lid: last + 1 if cap is None else min(last + 1, cap) for lid, last in readable.items()}
        if self._target is not None:
            out = {lid: min(n, self._target[lid]) for lid, n in out.items() if lid in self._target}
        return out

    def initialOffset(self) -> dict:
        available = self._available()
        first = self.opts.start_entry
        if self.opts.starting_position is StartingPosition.LATEST:
            start = {lid: max(first, n) for lid, n in available.items()}
        else:
            start = {lid: first for lid in available}
        return offs.to_json(start)

    def getDefaultReadLimit(self) -> Any:
        if self.opts.max_entries_per_trigger is not None and ReadMaxRows is not None:
            return ReadMaxRows(self.opts.max_entries_per_trigger)
        return ReadAllAvailable() if ReadAllAvailable is not None else None

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        if start is None:  # Spark < 4.2 calls latestOffset() without arguments
            start = self._last_end if self._last_end is not None else self.initialOffset()
            max_entries = self.opts.max_entries_per_trigger
        elif ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
            max_entries = limit.max_rows
        else:
            max_entries = None
        end = offs.admit(offs.from_json(start), self._available(), max_entries, self.opts.start_entry)
        self._last_end = offs.to_json(end)
        return self._last_end

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = None
        self._target = self._available()

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        ranges = offs.batch_ranges(offs.from_json(start), offs.from_json(end),
                                   self.opts.entries_per_partition, self.opts.start_entry)
        return [LedgerPartition.of(r) for r in ranges]

    def read(self, partition: LedgerPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.opts, partition)

    def commit(self, end: dict) -> None:
        pass
