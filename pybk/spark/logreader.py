"""Batch and streaming readers of named logs (driver side: which logs, where, and the partitions).

Offsets are `{"<log>": next offset}`: every record below it has been handed to Spark. A
micro-batch [start, end) of a log becomes ranges of entries of its segments: the entry holding
an edge offset is found by a binary search over entry headers (remembered, so the next batch,
which starts where this one ends, does not search again), the rest of each segment is cut into
partitions of about `bytesPerPartition` bytes of entries. Each partition keeps only the records
in its offset range, so a shared edge entry never yields a record twice.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition

from . import offsets as offs
from .errors import PybkSparkError, cause_first, cause_first_iter
from .logoptions import LogReadOptions
from .logscan import LogPartition, pieces_of, read_log_partition, split_entries
from .options import EARLIEST, LATEST
from .reader import ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow
from .runtime import client, is_no_such_ledger, run

if TYPE_CHECKING:
    from pybk.log import Logs

    from .logoptions import LogPositions

log = logging.getLogger("pybk.spark")

HEADER_CACHE = 4096   # entry headers remembered per reader (binary searches of edge offsets)


@dataclass(frozen=True)
class LogState:
    """What planning knows of one log: its offsets, segments and the password its readers use."""

    name: str
    start: int
    end: int
    segments: tuple                      # pybk.log.Segment, oldest first, TRUNCATED left out
    password: bytes
    producers: bool                      # some segment was written by an idempotent producer


def truncated_message(name: str, offset: int, start: int) -> str:
    """The data-loss error: which log, which offset, where the log starts now."""
    return (f"data loss: log {name!r}: offset {offset} was truncated away before the query read it (the log "
            f"now starts at offset {start}: {start - offset} record(s) lost); to skip lost records and go on, "
            "set option failOnDataLoss=false")


class LogPlanner:
    """Driver-side access to the logs of one query: names, states, edge entries, partitions."""

    def __init__(self, opts: LogReadOptions):
        self.opts = opts
        self._headers: dict[tuple[int, int], tuple[int, int]] = {}   # (ledger, entry) -> (first, end index)
        self._sizes: dict[int, float] = {}

    async def logs(self) -> "Logs":
        """The logs of the query's cluster, on this process's shared client."""
        from pybk.log import Logs
        return Logs(await client(self.opts.metadata_uri, self.opts.security))

    async def names(self, strict: bool, allow_none: bool = False) -> list[str]:
        """The logs the selection names or matches now; with `strict`, a named log that does not
        exist is an error, and so is matching none (unless `allow_none`: a stream waits for logs
        its patterns will match)."""
        from pybk.log import LogNotFoundError
        logs = await self.logs()
        sel = self.opts.logs
        existing = set(await logs.list())
        out = set()
        for n in sel.names:
            if n not in existing:
                if strict:
                    raise LogNotFoundError(n)
                continue
            out.add(n)
        if sel.patterns:
            out |= {n for n in existing if sel.matches(n)}
        if strict and not out and not allow_none:
            raise PybkSparkError(f"option log: no log matches {str(sel)!r}")
        return sorted(out)

    async def state(self, name: str) -> LogState | None:
        """The log's offsets and segments now (None: it no longer exists)."""
        from pybk.log import LogNotFoundError, SegmentState
        from pybk.log.reader import end_offset
        logs = await self.logs()
        try:
            ref = await logs.ref(name)
            password = self._password(ref)
            start = await logs.start_offset(name)
            segments = [s async for page in logs.meta.segments(ref.log_id) for s in page
                        if s.state is not SegmentState.TRUNCATED]
            end = await end_offset(logs, ref, password)
        except LogNotFoundError:
            return None
        return LogState(name, start, end, tuple(segments), password, any(s.producer for s in segments))

    def _password(self, ref) -> bytes:
        """CRC32C logs are read without a password; a MAC log's entries are signed with it."""
        from pybk.entry import DigestType
        if ref.config.digest is not DigestType.MAC:
            return b""
        return self.opts.password_for(ref.name)

    async def states(self, names: Sequence[str]) -> dict[str, LogState]:
        """The state of each of these logs that still exists."""
        out = {}
        for n in names:
            st = await self.state(n)
            if st is not None:
                out[n] = st
        return out

    async def start_of(self, st: LogState, positions: "LogPositions", first_run: bool) -> int:
        """Where a query starts reading a log: startingOffsets / the timestamps / the cursor."""
        logs = await self.logs()
        o = self.opts
        ts = dict(o.timestamps).get(st.name, o.starting_timestamp)
        if first_run and ts is not None:
            return max(st.start, await logs.offset_at_time(st.name, ts, st.password or None))
        if first_run and o.cursor is not None and not o.starting_given:
            for c in await logs.cursors(st.name, st.password or None):
                if c.name == o.cursor:
                    return c.offset
        p = positions.of(st.name) if first_run else EARLIEST
        return st.start if p == EARLIEST else st.end if p == LATEST else p

    def end_of(self, st: LogState) -> int:
        """The offset a scan stops before: endingOffsets, else the end now."""
        p = self.opts.ending.of(st.name)
        return st.end if p == LATEST else min(p, st.end)

    async def _header(self, md, password: bytes, entry: int) -> tuple[int, int]:
        from pybk.client import reader as ledger_reader
        from pybk.log import codec
        key = (md.ledger_id, entry)
        if key not in self._headers:
            body = await ledger_reader.read_one((await self.logs()).bk, md, password, entry, md.ensemble_for(entry))
            h = codec.read_header(body)
            if len(self._headers) >= HEADER_CACHE:
                self._headers.pop(next(iter(self._headers)))
            self._headers[key] = (h.first_index, h.end_index)
            self._sizes[md.ledger_id] = float(len(body))
        return self._headers[key]

    async def _entry_of(self, md, password: bytes, index: int, last: int) -> int:
        """The entry (of 0..last) holding record `index` of the segment: binary search of headers."""
        lo, hi = 0, last
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if (await self._header(md, password, mid))[0] <= index:
                lo = mid
            else:
                hi = mid - 1
        return lo

    async def ranges(self, st: LogState, lo: int, hi: int) -> list[tuple[LogPartition, int]]:
        """Partitions (with their entry counts) covering the log's records [lo, hi)."""
        from pybk.client import reader as ledger_reader
        from pybk.log import SegmentState
        bk = (await self.logs()).bk
        out: list[tuple[LogPartition, int]] = []
        for i, seg in enumerate(st.segments):
            closed = seg.state is SegmentState.CLOSED
            if closed and seg.records == 0:
                continue
            nxt = st.segments[i + 1].first_offset if i + 1 < len(st.segments) else None
            seg_end = seg.end_offset if closed else (nxt if nxt is not None else hi)
            a, b = max(lo, seg.first_offset), min(hi, seg_end)
            if a >= b:
                continue
            md = await bk.ledger_metadata(seg.ledger_id)
            last = seg.last_entry if closed else await ledger_reader.read_lac(bk, md)
            if last < 0:
                continue
            first_e = 0 if a == seg.first_offset else await self._entry_of(md, st.password, a - seg.first_offset, last)
            last_e = last if closed and b == seg_end else \
                await self._entry_of(md, st.password, b - 1 - seg.first_offset, last)
            if closed and seg.bytes:
                size = seg.bytes / (seg.last_entry + 1)
            else:
                size = self._sizes.get(seg.ledger_id) or float(len(await ledger_reader.read_one(
                    bk, md, st.password, last_e, md.ensemble_for(last_e))))
            out.append((LogPartition(st.name, seg.ledger_id, first_e, last_e, seg.first_offset, a, b, st.password,
                                     size), last_e - first_e + 1))
        return out

    def split(self, ranges: list[tuple[LogPartition, int]]) -> list[InputPartition]:
        """The ranges cut by bytesPerPartition, and further until there are minPartitions."""
        by_bytes = []
        for p, _ in ranges:
            for f, lst in split_entries(p.first_entry, p.last_entry, p.entry_bytes, self.opts.bytes_per_partition):
                by_bytes.append(LogPartition(p.log, p.ledger_id, f, lst, p.seg_first, p.lo, p.hi, p.password,
                                             p.entry_bytes))
        counts = pieces_of([p.last_entry - p.first_entry + 1 for p in by_bytes], self.opts.min_partitions)
        out: list[InputPartition] = []
        for p, n in zip(by_bytes, counts):
            for f, lst in split_entries(p.first_entry, p.last_entry, p.entry_bytes, 1 << 62, n):
                out.append(LogPartition(p.log, p.ledger_id, f, lst, p.seg_first, p.lo, p.hi, p.password,
                                        p.entry_bytes))
        return out

    def checked_start(self, st: LogState, offset: int) -> int:
        """offset, or the log's start when it was truncated away (failOnDataLoss: an error)."""
        if offset >= st.start:
            return offset
        if self.opts.fail_on_data_loss:
            raise PybkSparkError(truncated_message(st.name, offset, st.start))
        log.warning("pybk: log %r: offsets %d-%d were truncated away before the query read them; skipped %d "
                    "record(s) (failOnDataLoss=false)", st.name, offset, st.start - 1, st.start - offset)
        return st.start

    async def plan(self, bounds: dict[str, tuple[int, int]], states: dict[str, LogState]) -> list[InputPartition]:
        """The partitions of each log's records [lo, hi) (data loss checked against its start)."""
        ranges = []
        for name, (lo, hi) in sorted(bounds.items()):
            st = states.get(name)
            if st is None:
                if self.opts.fail_on_data_loss and hi > lo:
                    raise PybkSparkError(f"data loss: log {name!r} was deleted while the query read it (next "
                                         f"offset {lo}); to skip lost records and go on, set option "
                                         "failOnDataLoss=false")
                continue
            lo = self.checked_start(st, lo)
            if hi > lo:
                ranges += await self.ranges(st, lo, hi)
        return self.split(ranges)


def read_log(opts: LogReadOptions, part: InputPartition, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """One partition's batches of these columns (executor side); a segment deleted since planning
    is data loss."""
    try:
        yield from read_log_partition(opts.metadata_uri, opts.security, part, schema)
    except Exception as exc:
        if not is_no_such_ledger(exc) or not isinstance(part, LogPartition):
            raise
        start = run(_start_offset(opts, part.log))
        if opts.fail_on_data_loss:
            raise PybkSparkError(truncated_message(part.log, part.lo, start)) from None
        log.warning("pybk: log %r: offsets %d-%d were truncated away while the query read them; skipped "
                    "(failOnDataLoss=false)", part.log, part.lo, part.hi - 1)


async def _start_offset(opts: LogReadOptions, name: str) -> int:
    from pybk.log import LogNotFoundError, Logs
    try:
        return await Logs(await client(opts.metadata_uri, opts.security)).start_offset(name)
    except LogNotFoundError:
        return -1


def include_producer(opts: LogReadOptions) -> bool:
    """Whether the scan has producer_id and sequence: the option, else whether a log read was
    written by an idempotent producer."""
    if opts.include_producer is not None:
        return opts.include_producer

    async def any_producer() -> bool:
        planner = LogPlanner(opts)
        states = await planner.states(await planner.names(strict=False))
        return any(st.producers for st in states.values())
    return run(any_producer())


async def batch_partitions(opts: LogReadOptions) -> list[InputPartition]:
    """The partitions of a batch scan: each log from where the query starts to where it ends."""
    planner = LogPlanner(opts)
    states = await planner.states(await planner.names(strict=True))
    bounds = {}
    for name, st in states.items():
        bounds[name] = (await planner.start_of(st, opts.starting, True), planner.end_of(st))
    parts = await planner.plan(bounds, states)
    log.info("pybk scan of %d log(s): %d partitions", len(states), len(parts))
    return parts


class LogBatchReader(DataSourceReader):
    """A batch scan of logs from startingOffsets (or a time) to endingOffsets."""

    def __init__(self, opts: LogReadOptions, schema: pa.Schema):
        self.opts = opts
        self.schema = schema   # the Arrow schema of the batches (logscan.projection)

    def partitions(self) -> Sequence[InputPartition]:
        with cause_first():
            return run(batch_partitions(self.opts))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return cause_first_iter(read_log(self.opts, partition, self.schema))


class LogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Follows the selected logs (and new ones matching a pattern) with offsets {log: next offset};
    maxRecordsPerTrigger bounds each micro-batch. With option cursor, what the query has processed
    is committed to that durable cursor: at `commit(end)`, and at `latestOffset(start)`, whose start
    is the end of a batch Spark has finished (Spark commits a batch's source offsets only when it
    plans the next batch, so the last batch of an AvailableNow run would otherwise never be)."""

    def __init__(self, opts: LogReadOptions, schema: pa.Schema):
        self.opts = opts
        self.schema = schema   # the Arrow schema of the batches (logscan.projection)
        self.planner = LogPlanner(opts)
        self._target: dict[str, int] | None = None
        self._states: dict[str, LogState] = {}
        self._committed: dict[str, int] = {}

    async def _discover(self) -> dict[str, int]:
        """Per log, the end offset now (capped by endingOffsets and an AvailableNow target)."""
        self._states = await self.planner.states(await self.planner.names(strict=False))
        out = {n: self.planner.end_of(st) for n, st in self._states.items()}
        if self._target is not None:
            out = {n: min(e, self._target[n]) for n, e in out.items() if n in self._target}
        return out

    def initialOffset(self) -> dict:
        with cause_first():
            return run(self._initial())

    async def _initial(self) -> dict:
        await self.planner.names(strict=True, allow_none=not self.opts.logs.names)
        await self._discover()
        return {n: await self.planner.start_of(st, self.opts.starting, True) for n, st in sorted(self._states.items())}

    def getDefaultReadLimit(self) -> Any:
        if self.opts.max_records_per_trigger is not None and ReadMaxRows is not None:
            return ReadMaxRows(self.opts.max_records_per_trigger)
        return ReadAllAvailable() if ReadAllAvailable is not None else None

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        with cause_first():
            return run(self._latest(start, limit))

    async def _latest(self, start: dict | None, limit: Any) -> dict:
        start_given = start is not None
        if start is None:
            start = await self._initial()
            max_records = self.opts.max_records_per_trigger
        elif ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
            max_records = limit.max_rows
        else:
            max_records = None
        available = await self._discover()
        begin = {}
        for name, n in start.items():
            st = self._states.get(name)
            if st is None:
                if self.opts.fail_on_data_loss:
                    raise PybkSparkError(f"data loss: log {name!r} was deleted while the query read it (next "
                                         f"offset {n}); to skip lost records and go on, set option "
                                         "failOnDataLoss=false")
                log.warning("pybk: log %r was deleted while the query read it; dropped (failOnDataLoss=false)", name)
                continue
            begin[name] = self.planner.checked_start(st, int(n))
        if self.opts.cursor is not None and start_given:
            await self._commit_cursor(begin)
        for name, st in self._states.items():
            begin.setdefault(name, st.start)   # a log found while running: all of it is new
        end = offs.admit(begin, {n: max(e, begin.get(n, 0)) for n, e in available.items()}, max_records)
        return {n: int(v) for n, v in sorted(end.items())}

    def prepareForTriggerAvailableNow(self) -> None:
        with cause_first():
            self._target = None
            self._target = run(self._discover())

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        with cause_first():
            return run(self._partitions(start, end))

    async def _partitions(self, start: dict, end: dict) -> list[InputPartition]:
        names = sorted(end)
        states = {n: st for n, st in (await self.planner.states(names)).items()}
        bounds = {}
        for n in names:
            lo = int(start[n]) if n in start else (states[n].start if n in states else int(end[n]))
            bounds[n] = (lo, int(end[n]))
        return await self.planner.plan(bounds, states)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return cause_first_iter(read_log(self.opts, partition, self.schema))

    def commit(self, end: dict) -> None:
        if self.opts.cursor is None:
            return
        with cause_first():
            run(self._commit_cursor(end))

    async def _commit_cursor(self, end: dict) -> None:
        """Move the cursor to `end` (every record below it was processed), each log's only when
        it moved since the last commit."""
        from pybk.log import CursorError, LogNotFoundError
        logs = await self.planner.logs()
        for name, offset in sorted(end.items()):
            if self._committed.get(name) == int(offset):
                continue
            try:
                await logs.commit(name, self.opts.cursor, int(offset))
            except (CursorError, LogNotFoundError) as exc:
                log.warning("pybk: cursor %r of log %r not moved to %d: %s", self.opts.cursor, name, offset, exc)
            self._committed[name] = int(offset)
