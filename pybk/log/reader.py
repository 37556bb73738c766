"""`LogReader`: records of a log in offset order, from a position to an end or forever.

A reader never fences: it reads a CLOSED segment up to its last entry and the OPEN one up to its
LAC (what was acknowledged, so never a record recovery could drop). At the head of the log it
waits on two things at once, with no loop of etcd reads: a long-poll of the open segment's LAC on
its bookies, and a watch of the log's segment keys (a roll or a takeover seals the segment and
commits the next). Finding a segment by offset or time is a binary search over the segment keys
(one bounded range read per step), then over the entries of one segment (their headers).
"""
from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, AsyncIterator

from pybk.client import reader as ledger_reader
from pybk.client.errors import BKError, BookieUnavailableError, NoSuchEntryError
from pybk.meta.etcd import prefix_end
from pybk.meta.ledgers import LedgerMetadata
from pybk.meta.watch import Watch

from . import codec
from .errors import LogClosedError, LogNotFoundError, LogTruncatedError
from .layout import Segment, SegmentState

if TYPE_CHECKING:
    from .logs import LogRef, Logs

log = logging.getLogger("pybk.log")

LONG_POLL = 10.0     # seconds one LAC long-poll waits at most (then the metadata is looked at again)
POLL_RETRY = 0.5     # seconds before a LAC follow stream that failed is opened again
AHEAD_BYTES = 4 << 20   # entries that came with the LAC kept for the reader at most (the rest it reads)
TAIL_STREAM_MIN = 2  # entries read as one streamed range: a tail wakes to a few new entries at a time


class Ahead:
    """Entries that came with a LAC and are not handed out yet: the payloads of entries `first`,
    `first` + 1, ... (`bytes` of them; the followers add none beyond AHEAD_BYTES)."""

    __slots__ = ("first", "payloads", "bytes")

    def __init__(self) -> None:
        self.first = 0
        self.payloads: list[bytes] = []
        self.bytes = 0

    def put(self, first: int, payloads: list[bytes]) -> None:
        """Keep payloads of entries first, first + 1, ...: after those held if they follow them,
        else instead of them."""
        if self.payloads and first == self.first + len(self.payloads):
            self.payloads += payloads
            self.bytes += sum(map(len, payloads))
        elif payloads:
            self.first, self.payloads = first, list(payloads)
            self.bytes = sum(map(len, payloads))

    def take(self, first: int, last: int) -> list[bytes]:
        """The payloads of entries first.. up to `last` held here (none unless `first` is), which
        are then dropped with those before them."""
        k = first - self.first
        if not 0 <= k < len(self.payloads):
            if k >= len(self.payloads):
                self.payloads, self.bytes = [], 0
            return []
        n = min(len(self.payloads) - k, last - first + 1)
        out = self.payloads[k:k + n]
        self.first, self.payloads = first + n, self.payloads[k + n:]
        self.bytes = sum(map(len, self.payloads))
        return out


class SegmentView:
    """Read access to one segment's ledger: its metadata, what may be read (the last entry once
    CLOSED, else the LAC) and entry lookups by record index or timestamp."""

    def __init__(self, logs: "Logs", segment: Segment, md: LedgerMetadata, password: bytes):
        self.logs = logs
        self.segment = segment
        self.md = md
        self.password = password
        self.lac = segment.last_entry if segment.state is SegmentState.CLOSED else -1
        self.ahead = Ahead()                  # entries that came with the LAC
        self.moved = asyncio.Event()          # the LAC rose, or every follower failed
        self.failing: set[str] = set()        # bookies whose follow stream failed last
        self._followers: dict[str, asyncio.Task] = {}

    @classmethod
    async def open(cls, logs: "Logs", segment: Segment, password: bytes) -> "SegmentView":
        view = cls(logs, segment, await logs.bk.ledger_metadata(segment.ledger_id), password)
        if segment.state is SegmentState.OPEN:
            await view.refresh_lac()
        return view

    @property
    def closed(self) -> bool:
        return self.segment.state is not SegmentState.OPEN

    def sealed(self, segment: Segment) -> None:
        """The segment's key changed (sealed by a roll or a takeover)."""
        self.segment = segment
        if segment.state is not SegmentState.OPEN:
            self.lac = segment.last_entry
            self.stop()

    async def refresh_lac(self) -> int:
        if not self.closed:
            try:
                self._learn(await ledger_reader.read_lac(self.logs.bk, self.md))
            except BookieUnavailableError as e:
                log.info("segment %d (ledger %d): LAC not readable now: %s", self.segment.seq,
                         self.segment.ledger_id, e)
        return self.lac

    def _learn(self, lac: int) -> int:
        if not self.closed and lac > self.lac:
            self.lac = lac
        return self.lac

    def follow(self) -> None:
        """Follow the LAC on each bookie of the last fragment (readLastAddConfirmedAndEntry with
        no call per LAC: each bookie answers every rise of its LAC with the entries after the one
        it told before, and `moved` is set). A follower opens its stream again when it ends; this
        starts the ones missing (all at first, or after the ensemble changed)."""
        if self.closed:
            return
        bookies = self.md.fragments[-1].bookies
        for bookie in [b for b in self._followers if b not in bookies]:
            self._followers.pop(bookie).cancel()
            self.failing.discard(bookie)
        for bookie in bookies:
            if bookie not in self._followers:
                self._followers[bookie] = asyncio.ensure_future(self._follow(bookie))

    async def _follow(self, bookie: str) -> None:
        while True:
            try:
                async for lac, first, bodies, sizes in await ledger_reader.follow_lac(
                        self.logs.bk, self.md, bookie, self.lac, LONG_POLL):
                    self.failing.discard(bookie)
                    self._take(bookie, lac, first, bodies, sizes)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                if not ledger_reader.absent(e):   # a ledger no entry reached yet: follow on
                    if bookie not in self.failing:
                        log.info("segment %d (ledger %d): following the LAC on %s: %s", self.segment.seq,
                                 self.segment.ledger_id, bookie, e)
                    self.failing.add(bookie)
                    if self.failing.issuperset(self._followers):
                        self.moved.set()
                    await asyncio.sleep(POLL_RETRY)

    def _take(self, bookie: str, lac: int, first: int, bodies: bytes, sizes) -> None:
        """A follower's answer: a LAC above the one known is learnt, with the entries after that
        one among those that came (their digests checked here); an answer behind is dropped."""
        known = self.lac
        if lac <= known or self.closed:
            return
        self._learn(lac)
        skip = known + 1 - first
        if 0 <= skip < len(sizes) and self.ahead.bytes < AHEAD_BYTES:
            if skip:
                bodies, sizes = bodies[sum(sizes[:skip]):], sizes[skip:]
            self.ahead.put(known + 1, ledger_reader.verified_payloads(self.logs.bk, self.md, self.password, bookie,
                                                                      bodies, sizes, known + 1, 1)[0])
        self.moved.set()

    def stop(self) -> None:
        """Stop following (the reader is done with this segment, or it is sealed)."""
        for t in self._followers.values():
            t.cancel()
        self._followers.clear()

    async def entry(self, entry_id: int) -> bytes:
        try:
            return await ledger_reader.read_one(self.logs.bk, self.md, self.password, entry_id,
                                                self.md.ensemble_for(entry_id))
        except (NoSuchEntryError, BookieUnavailableError):
            self.md = await self.logs.bk.ledger_metadata(self.segment.ledger_id)   # an ensemble change
            return await ledger_reader.read_one(self.logs.bk, self.md, self.password, entry_id,
                                                self.md.ensemble_for(entry_id))

    async def entries(self, first: int, last: int) -> AsyncIterator[tuple[int, bytes]]:
        """(entry id, body) for first..last: those that came with the LAC (`ahead`), the rest
        streamed. The metadata is read again only when a read fails (the writer may have
        replaced a bookie since), then the rest is read once more."""
        eid = first
        for body in self.ahead.take(first, last):
            yield eid, body
            eid += 1
        if eid > last:
            return
        for attempt in range(2):
            try:
                async for chunk in ledger_reader.read_chunks(self.logs.bk, self.md, self.password, eid, last,
                                                             stream_min=TAIL_STREAM_MIN):
                    for body in chunk.payloads():
                        yield eid, body
                        eid += 1
                return
            except (NoSuchEntryError, BookieUnavailableError):
                if attempt:
                    raise
                self.md = await self.logs.bk.ledger_metadata(self.segment.ledger_id)

    async def entry_of_index(self, index: int) -> int:
        """The entry holding the record of segment-relative `index` (binary search of headers),
        among the entries readable now; -1 if none holds it yet."""
        lo, hi = 0, self.lac
        if hi < 0:
            return -1
        if index == 0:
            return 0
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if codec.read_header(await self.entry(mid)).first_index <= index:
                lo = mid
            else:
                hi = mid - 1
        h = codec.read_header(await self.entry(lo))
        return lo if h.first_index <= index < h.end_index else -1

    async def records_readable(self) -> int:
        """How many records the readable entries hold (the header of the last one says)."""
        if self.lac < 0:
            return 0
        return codec.read_header(await self.entry(self.lac)).end_index

    async def offset_at_time(self, timestamp: int) -> int | None:
        """The offset of the first readable record with a timestamp >= `timestamp`, None if none."""
        lo, hi = 0, self.lac
        if hi < 0:
            return None
        if codec.read_header(await self.entry(hi)).max_timestamp < timestamp:
            return None
        while lo < hi:
            mid = (lo + hi) // 2
            if codec.read_header(await self.entry(mid)).max_timestamp >= timestamp:
                hi = mid
            else:
                lo = mid + 1
        batch = codec.decode(await self.entry(lo))
        return self.segment.first_offset + batch.header.first_index + batch.first_at_or_after(timestamp)


async def find_segment(logs: "Logs", ref: "LogRef", offset: int) -> Segment | None:
    """The segment holding `offset` (or, past the end, the last one); None if there is no segment.
    A search over the sequence numbers, each step one key read: steps alternate between guessing
    from the offsets (segments of similar sizes: found in a few steps) and halving (never more
    than twice the steps of a binary search)."""
    meta = logs.meta
    first = await meta.segment_at_or_after(ref.log_id, 0)
    if first is None:
        return None
    last = await meta.last_segment(ref.log_id)
    if last is None or last.first_offset <= offset:
        return last or first
    # the answer, the last segment starting at or before offset, is in lo..hi; hi_off is where
    # segment hi + 1 starts
    lo, lo_off, hi, hi_off = first.seq, first.first_offset, last.seq - 1, last.first_offset
    found, guess = first, True
    while lo < hi:
        if guess and hi_off > lo_off:
            mid = lo + 1 + (offset - lo_off) * (hi + 1 - lo) // (hi_off - lo_off)
            mid = min(max(mid, lo + 1), hi)
        else:
            mid = (lo + hi + 1) // 2
        guess = not guess
        s = await meta.segment_at_or_after(ref.log_id, mid)
        if s is not None and s.first_offset <= offset:
            lo, lo_off, found = s.seq, s.first_offset, s
        else:
            hi = mid - 1
            if s is not None and s.seq == mid:
                hi_off = s.first_offset
    return found if found.seq == lo else await meta.segment_at_or_after(ref.log_id, lo)


async def segment_at_time(logs: "Logs", ref: "LogRef", timestamp: int) -> Segment | None:
    """The first segment that may hold a record at or after `timestamp`: the first CLOSED one whose
    newest record is, else the OPEN one; None if there is none. Binary search; a probe steps over
    empty segments, which keeps the predicate monotonic."""
    meta = logs.meta
    first = await meta.segment_at_or_after(ref.log_id, 0)
    if first is None:
        return None
    last = await meta.last_segment(ref.log_id)

    async def probe(seq: int) -> Segment | None:
        s = await meta.segment_at_or_after(ref.log_id, seq)
        while s is not None and s.state is not SegmentState.OPEN and s.records == 0:
            s = await meta.segment_at_or_after(ref.log_id, s.seq + 1)
        return s

    lo, hi = first.seq, last.seq + 1
    while lo < hi:
        mid = (lo + hi) // 2
        s = await probe(mid)
        if s is None or s.state is SegmentState.OPEN or s.max_ts >= timestamp:
            hi = mid
        else:
            lo = s.seq + 1
    return await probe(lo) if lo <= last.seq else None


class LogReader:
    """`async for record in reader`: records from `position` on, up to `end` (exclusive; None:
    forever, waiting for new records at the head of the log)."""

    def __init__(self, logs: "Logs", ref: "LogRef", position: int, end: int | None, password: bytes):
        self._logs = logs
        self._ref = ref
        self.position = position
        self.end = end
        self._password = password
        self._view: SegmentView | None = None
        self._changed = asyncio.Event()
        self._watch: Watch | None = None
        self._watcher: asyncio.Task | None = None
        self._gen: AsyncIterator | None = None
        self._closed = False

    @property
    def name(self) -> str:
        return self._ref.name

    def __aiter__(self) -> "LogReader":
        return self

    async def __anext__(self) -> codec.LogRecord:
        if self._gen is None:
            self._gen = self._records()
        return await self._gen.__anext__()

    async def read(self, max_records: int) -> list[codec.LogRecord]:
        """Up to `max_records` records (fewer at the end); at the head of a tailing reader this
        waits for at least one."""
        out: list[codec.LogRecord] = []
        if self._gen is None:
            self._gen = self._records()
        async for rec in self._gen:
            out.append(rec)
            if len(out) >= max_records:
                break
        return out

    async def _start_watch(self) -> None:
        if self._watch is not None:
            return
        meta = self._logs.meta
        k = meta.keys.segments(self._ref.log_id)
        rev = await meta.segment_revision(self._ref.log_id)
        self._watch = Watch(meta.etcd, k, prefix_end(k), start_revision=rev + 1)
        self._watcher = asyncio.ensure_future(self._watch_segments())

    async def _watch_segments(self) -> None:
        try:
            async for _ in self._watch:
                self._changed.set()
        except Exception as e:   # compaction or a refused watch: fall back to the LAC long-poll's timeout
            log.info("log %s: the segment watch stopped: %s", self.name, e)
            self._watch = None

    async def _segment(self, seq: int) -> Segment | None:
        return await self._logs.meta.segment(self._ref.log_id, seq)

    async def _check_start(self, offset: int) -> None:
        head = await self._logs.meta.head(self._ref.log_id)
        if head is None:
            raise LogNotFoundError(self.name)
        if offset < head.start_offset:
            raise LogTruncatedError(self.name, offset, head.start_offset)

    async def _records(self) -> AsyncIterator[codec.LogRecord]:
        await self._check_start(self.position)
        if self.end is None:
            await self._start_watch()
        seg = await find_segment(self._logs, self._ref, self.position)
        while seg is None:
            if self.end is not None and self.position >= self.end:
                return
            await self._wait_change(None)
            seg = await find_segment(self._logs, self._ref, self.position)
        while True:
            if self.end is not None and self.position >= self.end:
                return
            if seg.state is SegmentState.TRUNCATED:
                await self._check_start(self.position)
            view = self._view = await self._open_view(seg)
            try:
                async for rec in self._read_segment(view):
                    yield rec
                    if self.end is not None and self.position >= self.end:
                        return
            finally:
                view.stop()
            seg = await self._next_segment(view.segment)

    async def _open_view(self, seg: Segment) -> SegmentView:
        try:
            return await SegmentView.open(self._logs, seg, self._password)
        except BKError:
            await self._check_start(self.position)   # truncated meanwhile: say so, naming the start
            raise

    async def _read_segment(self, view: SegmentView) -> AsyncIterator[codec.LogRecord]:
        """Records of one segment from self.position on, to its end (waiting while it is OPEN)."""
        rel = self.position - view.segment.first_offset
        entry = -1
        while entry < 0:
            if view.closed and rel >= view.segment.records:
                return
            entry = await view.entry_of_index(rel)
            if entry < 0:
                if view.closed:
                    return
                await self._wait_more(view)
        while True:
            if entry <= view.lac:   # (the LAC may rise while these are handed out: then on at once)
                async for _, body in view.entries(entry, view.lac):
                    batch = codec.decode(body)
                    first = view.segment.first_offset + batch.header.first_index
                    for rec in batch.records(first, max(0, self.position - first)):
                        if self.end is not None and rec.offset >= self.end:
                            return
                        self.position = rec.offset + 1
                        yield rec
                    entry += 1
            elif view.closed:
                return
            else:
                await self._wait_more(view)

    async def _wait_more(self, view: SegmentView) -> None:
        """At the head of an OPEN segment: until its LAC moves (its bookies' follow streams tell,
        with the entries) or its key changes; LONG_POLL at most, then the metadata is looked at
        again."""
        lac = view.lac
        await self._start_watch()
        view.follow()
        view.moved.clear()
        if view.lac == lac and not self._changed.is_set():
            moved = asyncio.ensure_future(view.moved.wait())
            change = asyncio.ensure_future(self._changed.wait())
            try:
                await asyncio.wait({moved, change}, timeout=LONG_POLL, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for t in (moved, change):
                    if not t.done():
                        t.cancel()
        if view.lac == lac and view.failing and view.failing.issuperset(view.md.fragments[-1].bookies):
            log.info("log %s: no bookie of segment %d tells its LAC now", self.name, view.segment.seq)
            await self._wait_change(POLL_RETRY)   # look again after a pause, or at once when the segment changes
        if self._changed.is_set() or view.lac == lac:
            self._changed.clear()
            seg = await self._segment(view.segment.seq)
            if seg is not None:
                view.sealed(seg)
            if view.lac == lac and not view.closed:
                view.md = await self._logs.bk.ledger_metadata(view.segment.ledger_id)
                await view.refresh_lac()
                view.follow()   # the bookies of a new fragment too

    async def _wait_change(self, timeout: float | None = LONG_POLL) -> None:
        """Until a segment key changes (a roll, a takeover, a truncation), or `timeout`."""
        await self._start_watch()
        try:
            await asyncio.wait_for(self._changed.wait(), timeout)
        except TimeoutError:
            pass
        self._changed.clear()

    async def _next_segment(self, seg: Segment) -> Segment:
        """The segment after `seg`, waiting for it to be committed (only when reading forever)."""
        while True:
            nxt = await self._logs.meta.segment_at_or_after(self._ref.log_id, seg.seq + 1)
            if nxt is not None:
                return nxt
            if self.end is not None and self.position >= self.end:
                return seg
            await self._wait_change()

    async def close(self) -> None:
        self._closed = True
        if self._view is not None:
            self._view.stop()
        if self._gen is not None:
            await self._gen.aclose()
        if self._watch is not None:
            await self._watch.close()
        if self._watcher is not None:
            self._watcher.cancel()

    async def __aenter__(self) -> "LogReader":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


async def end_offset(logs: "Logs", ref: "LogRef", password: bytes) -> int:
    """The offset after the last acknowledged record now (the start offset of an empty log)."""
    last = await logs.meta.last_segment(ref.log_id)
    if last is None:
        head = await logs.meta.head(ref.log_id)
        return head.start_offset if head is not None else 0
    if last.state is not SegmentState.OPEN:
        return last.end_offset
    view = await SegmentView.open(logs, last, password)
    return last.first_offset + await view.records_readable()


async def offset_at_time(logs: "Logs", ref: "LogRef", timestamp: int, password: bytes) -> int:
    """The offset of the first record whose timestamp is >= `timestamp` (the end offset if none)."""
    seg = await segment_at_time(logs, ref, timestamp)
    while seg is not None:
        view = await SegmentView.open(logs, seg, password)
        off = await view.offset_at_time(timestamp)
        if off is not None:
            return off
        if seg.state is SegmentState.OPEN:
            break
        seg = await logs.meta.segment_at_or_after(ref.log_id, seg.seq + 1)
    return await end_offset(logs, ref, password)
