"""`LogWriter`: the one writer of a log, by epoch.

Open (`open_writer`): bump the head's epoch (a CAS), fence and recover the OPEN segment with the
ledger protocol, then in one transaction seal it and open the next segment on a ledger made
meanwhile. Losing that transaction to a newer epoch deletes the ledger and raises LogFencedError.

Appends are packed into the current entry (codec.BatchBuilder) and sent when it reaches
`batch_bytes` or `linger` after its first record; each append is acknowledged with its entry.
A roll switches appends to a ledger made ahead of time at once, closes the old ledger in the
background, then one transaction seals the old segment and commits the new one; the new
segment's acknowledgements wait for that transaction, so nothing is acknowledged in a segment
that may never be committed. The next ledger is then made ahead again.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Iterable

import numpy as np

from pybk.client.errors import BKError, LedgerClosedError, LedgerFencedError

from . import codec, failpoints, metrics
from .dedup import Dedup, Duplicate, Forgotten
from .errors import (DuplicateSequenceError, InvalidLogConfigError, LogClosedError, LogError, LogFencedError,
                     LogNotFoundError)
from .layout import (Conflict, Head, LogState, Segment, SegmentState, SegmentSummary, after_head_conflict,
                     ledger_custom, open_next, seal, take_over)
from .options import WriterOptions

if TYPE_CHECKING:
    from .logs import LogRef, Logs

log = logging.getLogger("pybk.log")


ROLL_RETRY = 1.0     # seconds before a roll that could not make its ledger is tried again


def now_ms() -> int:
    return int(time.time() * 1000)


class _Batch:
    """The records of one entry: built, then sent, then acknowledged (`done`)."""

    __slots__ = ("builder", "first_index", "producer", "first_seq", "done", "segment", "count", "size")

    def __init__(self, first_index: int, producer: int, first_seq: int, done: asyncio.Future, segment: "_Seg"):
        self.builder = codec.BatchBuilder()
        self.first_index = first_index
        self.producer = producer
        self.first_seq = first_seq
        self.done = done
        self.segment = segment
        self.count = 0      # records and bytes, once sent
        self.size = 0


class _Seg:
    """The writer's view of a segment it writes: its ledger, counters, and whether it is committed."""

    def __init__(self, seq: int, first_offset: int, lh, committed: bool, created: float):
        self.seq = seq
        self.first_offset = first_offset
        self.lh = lh
        self.committed = committed
        self.held: list[_Batch] = []       # acked entries waiting for the commit
        self.records = 0
        self.bytes = 0
        self.min_ts = -1
        self.max_ts = -1
        self.created = created
        self.last_append = created
        self.stored: Segment | None = None   # as committed in etcd


class PendingAppend:
    """An append in flight: its `offset` is known at once; awaiting it waits for the
    acknowledgement (and raises what failed it)."""

    __slots__ = ("offset", "_ack")

    def __init__(self, offset: int, ack: asyncio.Future):
        self.offset = offset
        self._ack = ack

    def __await__(self):
        yield from self._ack.__await__()
        return self.offset

    def done(self) -> bool:
        return self._ack.done()

    def add_done_callback(self, fn) -> None:
        """Call `fn(self)` once the append is acknowledged or failed (then `await` it for which)."""
        self._ack.add_done_callback(lambda _: fn(self))

    def exception(self) -> BaseException | None:
        """What failed the append (None if acknowledged); only once done()."""
        return self._ack.exception()


async def summarize(lh, first_offset: int, dedup: Dedup | None) -> SegmentSummary:
    """What a closed segment ledger holds (records, bytes, timestamps, last entry), read from its
    entries; with `dedup`, each entry's producer and sequences are learnt too (the recovered tail)."""
    last = lh.last_add_confirmed
    if last < 0:
        return SegmentSummary(0, 0, -1, -1, -1)
    size = 0
    header = None
    min_ts = -1
    if dedup is None:
        first = codec.decode(await lh.read_entry(0))
        header = codec.read_header(await lh.read_entry(last)) if last else first.header
        return SegmentSummary(header.end_index, lh.length, int(first.timestamps[0]), header.max_timestamp, last)
    async for chunk in lh.read_chunks(0, last):
        for body in chunk.payloads():
            size += len(body)
            header = codec.read_header(body)
            if min_ts < 0:
                min_ts = int(codec.decode(body).timestamps[0])
            if header.producer_id:
                dedup.record(header.producer_id, header.first_sequence, header.count,
                             first_offset + header.first_index, header.max_timestamp)
    return SegmentSummary(header.end_index, size, min_ts, header.max_timestamp, last)


async def _create_ledger(logs: "Logs", ref: "LogRef", password: bytes, seq: int, epoch: int):
    cfg = ref.config
    return await logs.bk.create_ledger(cfg.ensemble, cfg.write_quorum, cfg.ack_quorum, cfg.digest, password,
                                       metadata=ledger_custom(ref.log_id, seq, epoch))


async def _discard(logs: "Logs", lh, password: bytes) -> None:
    """Delete a ledger this writer made but never committed (best effort: orphan reclaim finds it
    otherwise)."""
    try:
        lh._abandon()
        await logs.bk.delete_ledger(lh.ledger_id, password)
    except Exception as e:
        log.info("could not delete uncommitted ledger %d (orphan reclaim will): %s", lh.ledger_id, e)


async def open_writer(logs: "Logs", ref: "LogRef", password: bytes, options: WriterOptions) -> "LogWriter":
    """Take the log over (see the module docstring); LogFencedError if a newer writer wins meanwhile."""
    options.validate()
    meta = logs.meta
    lease = await logs.bk.store.session.lease_id()
    head = await meta.head(ref.log_id)
    while True:
        if head is None or head.state is not LogState.ACTIVE:
            raise LogNotFoundError(ref.name)
        mine = take_over(head, options.name)
        ok, now, rev = await meta.put_head(ref.log_id, mine, lease=lease, writer=options.name)
        if ok:
            head = replace(mine, version=rev)
            break
        head = now
    epoch = head.epoch
    await failpoints.hit("open.after_epoch")
    last = await meta.last_segment(ref.log_id)
    seq = head.last_seq + 1
    creating = asyncio.ensure_future(_create_ledger(logs, ref, password, seq, epoch))
    try:
        dedup = Dedup.from_snapshot(last.dedup if last else b"", options.max_producers,
                                    int(options.producer_idle * 1000), options.dedup_window)
        sealed: list[Segment] = []
        next_offset, last_ts = head.start_offset, -1
        if last is not None:
            if last.state is SegmentState.OPEN:
                rh = await logs.bk.open_ledger(last.ledger_id, password, recovery=True)
                # only an idempotent writer's entries carry sequences: else the first and last entry say all
                summary = await summarize(rh, last.first_offset, dedup if last.producer else None)
                last = seal(last, summary)
                last = replace(last, dedup=dedup.snapshot())
                sealed.append(last)
                await failpoints.hit("open.after_recover")
            next_offset, last_ts = last.end_offset, last.max_ts
            dedup.expire(last_ts)
        lh = await creating
    except BaseException:
        if not creating.done():
            creating.cancel()
        elif not creating.cancelled() and creating.exception() is None:
            await _discard(logs, creating.result(), password)
        raise
    await failpoints.hit("open.after_create")
    created = time.monotonic()
    while True:
        new_head, seg = open_next(head, epoch, lh.ledger_id, next_offset, now_ms(), dedup.snapshot(),
                                  options.producer_id or 0)
        ok, now, rev = await meta.commit(ref.log_id, head, new_head, sealed + [seg])
        if ok:
            break
        if after_head_conflict(now, epoch) is Conflict.FENCED:
            await _discard(logs, lh, password)
            raise LogFencedError(ref.name, now.epoch if now is not None else -1,
                                 "while opening: a newer writer registered first")
        head = now
    current = _Seg(seg.seq, next_offset, lh, committed=True, created=created)
    current.stored = replace(seg, version=rev)
    w = LogWriter(logs, ref, password, options, replace(new_head, version=rev), current, dedup, max(last_ts, 0), lease)
    w._prepare_next()
    return w


class LogWriter:
    """The log's writer (from `Logs.open_writer`): append, append_nowait, append_many, flush, close."""

    def __init__(self, logs: "Logs", ref: "LogRef", password: bytes, options: WriterOptions, head: Head,
                 segment: _Seg, dedup: Dedup, last_ts: int, lease: int):
        self._logs = logs
        self._ref = ref
        self._password = password
        self.options = options
        self._head = head
        self._seg = segment
        self._dedup = dedup
        self._last_ts = last_ts
        self._lease = lease
        self._next_offset = segment.first_offset
        self._index = 0                       # the next record's index within the segment
        self._batch: _Batch | None = None
        self._linger: asyncio.TimerHandle | None = None
        self._appended_at = -1e9              # when the last record was appended (the loop's clock)
        self._inflight: set[_Batch] = set()   # sent, not yet acknowledged
        self._unacked = 0                     # entries sent whose add is not answered yet
        self._flush_at_ack = False            # the current entry goes when the next add is answered
        self._error: BaseException | None = None
        self._failing: asyncio.Task | None = None
        self._next: asyncio.Future | None = None   # the next segment's ledger, being made
        self._rolling: asyncio.Task | None = None
        self._closed = False
        self._loop = asyncio.get_running_loop()
        self._producer = options.producer_id or 0
        self.rolls = 0
        self._metrics = metrics.WriterMetrics(ref.name)
        self._roll_after = 0.0                # no roll before (monotonic time): the last one could not start
        r = ref.config.rollover
        checks = [t for t in (r.max_age, r.max_idle) if t is not None]
        self._timer = asyncio.ensure_future(self._watch_time(min(checks))) if checks else None
        logs.bk.store.session.on_new_lease(self._renew_writer_key)

    async def _renew_writer_key(self, lease: int) -> None:
        """The session lease was lost and replaced: the writer key (what says a live writer has the
        log, so it is not deleted) goes on the new lease, while this writer still owns the log."""
        if not self._closed and self._error is None:
            self._lease = lease
            await self._logs.meta.renew_writer(self._ref.log_id, self.epoch, self.options.name, lease)

    # ---- properties ---------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._ref.name

    @property
    def epoch(self) -> int:
        return self._head.epoch

    @property
    def next_offset(self) -> int:
        """The offset the next append gets."""
        return self._next_offset

    @property
    def segment_seq(self) -> int:
        return self._seg.seq

    # ---- appending ----------------------------------------------------------------------

    def _failed_future(self, exc: BaseException) -> PendingAppend:
        fut = self._loop.create_future()
        fut.set_exception(exc)
        fut.exception()
        return PendingAppend(-1, fut)

    def _refusal(self) -> BaseException | None:
        if self._error is not None:
            return self._error
        if self._closed:
            return LogClosedError(f"the writer of log {self.name!r} is closed")
        return None

    def _timestamp(self, timestamp: int | None) -> int:
        ts = now_ms() if timestamp is None else int(timestamp)
        if ts < self._last_ts:
            ts = self._last_ts
        self._last_ts = ts
        return ts

    def append_nowait(self, payload: bytes, *, key: bytes | None = None, timestamp: int | None = None,
                      sequence: int | None = None) -> PendingAppend:
        """Append without waiting: the record's offset is known at once (`.offset`); await the
        result for the acknowledgement. `timestamp` (ms, default now) is raised to the log's last
        one if older. With a producer id, `sequence` (default: the producer's next) identifies the
        record: a sequence already stored is not stored again and answers with its first offset."""
        refusal = self._refusal()
        if refusal is not None:
            return self._failed_future(refusal)
        if type(payload) is not bytes:
            payload = bytes(payload)
        pid = self._producer
        if pid:
            seq = self._dedup.next_sequence(pid) if sequence is None else sequence
            known = self._dedup.check(pid, seq)
            if isinstance(known, Duplicate):
                if known.ack is None:
                    fut = self._loop.create_future()
                    fut.set_result(None)
                    return PendingAppend(known.offset, fut)
                return PendingAppend(known.offset, known.ack)
            if isinstance(known, Forgotten):
                return self._failed_future(DuplicateSequenceError(self.name, pid, seq, known.last_seq))
            b = self._batch
            if b is not None and b.first_seq + b.builder.count != seq:
                self._flush()
        elif sequence is not None:
            return self._failed_future(InvalidLogConfigError(
                f"log {self.name!r}: sequence= needs a writer with a producer_id"))
        else:
            seq = codec.NO_SEQUENCE
        ts = self._timestamp(timestamp)
        b = self._batch
        if b is None:
            b = self._start_batch(seq)
        self._appended_at = self._loop.time()
        b.builder.add(payload, key, ts)
        offset = self._next_offset
        self._next_offset = offset + 1
        self._index += 1
        if pid:
            self._dedup.record(pid, seq, 1, offset, ts, b.done)
        if b.builder.size >= self.options.batch_bytes:
            self._flush()
        return PendingAppend(offset, b.done)

    async def append(self, payload: bytes, *, key: bytes | None = None, timestamp: int | None = None,
                     sequence: int | None = None) -> int:
        """Append one record; returns its offset once it is acknowledged (see append_nowait)."""
        return await self.append_nowait(payload, key=key, timestamp=timestamp, sequence=sequence)

    async def append_many(self, payloads: Iterable[bytes], *, timestamp: int | None = None) -> range:
        """Append keyless records, all stamped `timestamp` (default now), packed with no per-record
        future; returns their offsets (consecutive) once all are acknowledged. With a producer id
        they take the producer's next sequences."""
        refusal = self._refusal()
        if refusal is not None:
            raise refusal
        payloads = payloads if isinstance(payloads, list) else list(payloads)
        first = self._next_offset
        if not payloads:
            return range(first, first)
        ts = self._timestamp(timestamp)
        pid = self._producer
        limit = self.options.batch_bytes
        acks = []
        n = len(payloads)
        lengths = np.fromiter(map(len, payloads), np.int64, n)
        ends_by_head: dict[int, np.ndarray] = {}   # per record header size: bytes of records 0..i
        i = 0
        while i < n:
            b = self._batch
            if b is None:
                b = self._start_batch(self._dedup.next_sequence(pid) if pid else codec.NO_SEQUENCE)
            self._appended_at = self._loop.time()
            head = b.builder.header_size(True, ts)
            ends = ends_by_head.get(head)
            if ends is None:
                ends = ends_by_head[head] = np.cumsum(lengths + head)
            before = int(ends[i - 1]) if i else 0
            # records i..j-1 fill the entry up to the limit (at least one record per entry)
            j = max(i + 1, int(np.searchsorted(ends, before + limit - b.builder.size, side="right")))
            b.builder.add_many(payloads[i:j], ts, lengths[i:j])
            if pid:
                self._dedup.record(pid, b.first_seq + b.builder.count - (j - i), j - i, self._next_offset, ts, b.done)
            self._next_offset += j - i
            self._index += j - i
            acks.append(b.done)
            if j < n or b.builder.size >= limit:   # full: the next record would not fit
                self._flush()
            i = j
        await asyncio.gather(*dict.fromkeys(acks))
        return range(first, first + n)

    def _start_batch(self, seq: int) -> _Batch:
        """A new entry: sent once full, else `linger` after its first record. When that record
        came `linger`/2 or more after the previous one (records that far apart would rarely
        share an entry), it is sent at the next turn of the loop, or, while an entry of this
        writer is unacknowledged, when that one is acknowledged (or once full): the bookie
        clients would mostly hold it until then anyway, and sent then it carries that entry's
        LAC, so tailing readers get that entry without waiting for a later one; and a writer
        whose adds take longer than its records' spacing packs them into fewer entries instead
        of queueing one entry each (less work for the bookies and readers: lower latency)."""
        b = self._batch = _Batch(self._index, self._producer, seq, self._loop.create_future(), self._seg)
        loop, linger = self._loop, self.options.linger
        if loop.time() - self._appended_at < linger / 2:
            self._linger = loop.call_later(linger, self._flush)
        elif self._unacked and linger:
            self._flush_at_ack = True
        else:
            self._linger = loop.call_soon(self._flush)
        return b

    def _flush(self) -> None:
        """Send the current entry."""
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        self._flush_at_ack = False
        b, self._batch = self._batch, None
        if b is None or not b.builder.count:
            return
        if self._error is not None:
            self._reject(b, self._error)
            return
        seg = b.segment
        body = b.builder.build(b.first_index, b.producer, b.first_seq)
        bb = b.builder
        seg.records += bb.count
        seg.bytes += len(body)
        b.count, b.size = bb.count, len(body)
        metrics.BATCH_FILL.observe(min(1.0, len(body) / self.options.batch_bytes))
        if seg.min_ts < 0:
            seg.min_ts = codec.decode(body).timestamps[0].item() if bb.count else -1
        seg.max_ts = max(seg.max_ts, bb.max_ts)
        seg.last_append = time.monotonic()
        b.builder = None   # the bytes live in the ledger handle's pending add now
        self._inflight.add(b)
        self._unacked += 1
        seg.lh.add_entry_async(body).add_done_callback(lambda f, b=b: self._on_entry(b, f))
        self._maybe_roll()

    def _on_entry(self, b: _Batch, fut: asyncio.Future) -> None:
        self._unacked -= 1
        if self._flush_at_ack:
            self._flush()
        if fut.cancelled() or fut.exception() is not None:
            self._broken(fut.exception() if not fut.cancelled() else LogClosedError("append cancelled"))
            return
        if b.segment.committed:
            self._ack(b)
        else:
            b.segment.held.append(b)

    def _ack(self, b: _Batch) -> None:
        self._inflight.discard(b)
        if not b.done.done():
            b.done.set_result(None)
            m = self._metrics
            m.records.inc(b.count)
            m.bytes.inc(b.size)
            m.entries.inc()

    def _reject(self, b: _Batch, exc: BaseException) -> None:
        self._inflight.discard(b)
        if not b.done.done():
            b.done.set_exception(exc)
            b.done.exception()

    # ---- failure ------------------------------------------------------------------------

    def _broken(self, exc: BaseException) -> None:
        """An entry failed: this writer can append no more. Find out whether it was fenced (the
        head names a newer epoch) and fail everything pending with that."""
        if self._failing is None and self._error is None:
            self._failing = asyncio.ensure_future(self._fail_from(exc))

    async def _fail_from(self, exc: BaseException) -> None:
        try:
            head = await self._logs.meta.head(self._ref.log_id)
        except Exception as e:
            log.info("log %s: could not read the head after a failed append: %s", self.name, e)
            head = self._head
        if head is None or head.epoch != self.epoch or head.state is not LogState.ACTIVE \
                or isinstance(exc, (LedgerFencedError, LedgerClosedError)):
            epoch = head.epoch if head is not None else -1
            err: BaseException = LogFencedError(self.name, epoch, f"{type(exc).__name__}: {exc}")
        else:
            err = LogClosedError(f"the writer of log {self.name!r} failed and can append no more: {exc}")
            err.__cause__ = exc
        self._fail(err)

    def _fail(self, err: BaseException) -> None:
        if self._error is None:
            self._error = err
            if isinstance(err, LogFencedError):
                self._metrics.fencings.inc()
            log.warning("log %s: writer of epoch %d stops: %s", self.name, self.epoch, err)
        if self._batch is not None:
            self._flush()
        for b in list(self._inflight):
            self._reject(b, err)
        self._seg.held.clear()
        if self._timer is not None:
            self._timer.cancel()

    # ---- rolling ------------------------------------------------------------------------

    def _prepare_next(self) -> None:
        """Make the next segment's ledger now, so a roll never waits for more than this."""
        if self._next is None and self._error is None and not self._closed:
            self._next = asyncio.ensure_future(_create_ledger(self._logs, self._ref, self._password,
                                                              self._seg.seq + 1, self.epoch))

    def _due(self, now: float) -> bool:
        r, seg = self._ref.config.rollover, self._seg
        if seg.records == 0 or now < self._roll_after:
            return False
        return ((r.max_bytes is not None and seg.bytes >= r.max_bytes)
                or (r.max_records is not None and seg.records >= r.max_records)
                or (r.max_age is not None and now - seg.created >= r.max_age)
                or (r.max_idle is not None and now - seg.last_append >= r.max_idle))

    def _maybe_roll(self) -> None:
        if self._rolling is None and self._error is None and not self._closed and self._due(time.monotonic()):
            self._rolling = asyncio.ensure_future(self._roll())

    async def roll(self) -> None:
        """Roll now (if the segment holds records): close it and continue in the next one."""
        while self._rolling is not None:
            await asyncio.shield(self._rolling)
        if self._seg.records and self._error is None:
            self._rolling = asyncio.ensure_future(self._roll())
            await asyncio.shield(self._rolling)
        if self._error is not None:
            raise self._error

    async def _roll(self) -> None:
        try:
            await self._roll_steps()
        except BaseException as e:
            if not isinstance(e, asyncio.CancelledError):
                if isinstance(e, (LogFencedError, LogClosedError)):
                    self._fail(e)
                else:
                    self._broken(e)
        finally:
            self._rolling = None
        self._maybe_roll()

    async def _roll_steps(self) -> None:
        self._prepare_next()
        try:
            next_lh = await self._next
        except Exception as e:   # no next ledger (too few bookies, etcd away): append on here, try again later
            self._next = None
            self._roll_after = time.monotonic() + ROLL_RETRY
            log.warning("log %s: could not make the next segment's ledger (%s); segment %d goes on, rolling "
                        "again in %.0f s", self.name, e, self._seg.seq, ROLL_RETRY)
            return
        self._next = None
        if self._error is not None:
            await _discard(self._logs, next_lh, self._password)
            return
        # the switch: no await between the last entry of the old segment and the first of the new
        self._flush()
        old = self._seg
        self._dedup.expire(self._last_ts)
        snapshot = self._dedup.snapshot()
        new = _Seg(old.seq + 1, self._next_offset, next_lh, committed=False, created=time.monotonic())
        self._seg, self._index = new, 0
        self.rolls += 1
        self._metrics.rolls.inc()
        try:
            await old.lh.close()
            await failpoints.hit("roll.after_close")
            summary = SegmentSummary(old.records, old.bytes, old.min_ts, old.max_ts, old.lh.last_add_confirmed)
            await self._commit([replace(seal(old.stored, summary), dedup=snapshot)], new, snapshot)
        except BaseException as e:
            if not new.committed:
                if isinstance(e, LogError):
                    self._fail(e)
                else:
                    self._broken(e)
                await _discard(self._logs, new.lh, self._password)   # never committed: nobody reads it
            raise
        await failpoints.hit("roll.after_commit")
        self._prepare_next()

    async def _commit(self, sealed: list[Segment], new: _Seg | None, snapshot: bytes) -> None:
        """One transaction: seal `sealed` and, with `new`, commit it as the next segment; then
        release the acknowledgements `new` holds. A newer epoch fails the writer."""
        meta, head = self._logs.meta, self._head
        while True:
            put, new_head, seg = list(sealed), None, None
            if new is not None:
                new_head, seg = open_next(head, self.epoch, new.lh.ledger_id, new.first_offset, now_ms(), snapshot,
                                          self._producer)
                put.append(seg)
            ok, now, rev = await meta.commit(self._ref.log_id, head, new_head, put)
            if ok:
                break
            if after_head_conflict(now, self.epoch) is Conflict.FENCED:
                raise LogFencedError(self.name, now.epoch if now is not None else -1,
                                     f"while committing segment {new.seq if new else sealed[0].seq}")
            head = now
        self._head = replace(new_head or head, version=rev)
        if new is not None:
            new.stored = replace(seg, version=rev)
            new.committed = True
            held, new.held = new.held, []
            for b in held:
                self._ack(b)

    async def _watch_time(self, period: float) -> None:
        """Roll by age or idle time (checked a few times per period)."""
        step = min(max(period / 4, 0.05), 60.0)
        while not self._closed and self._error is None:
            await asyncio.sleep(step)
            self._maybe_roll()

    # ---- closing ------------------------------------------------------------------------

    async def flush(self) -> None:
        """Send the current entry now, wait until everything appended so far is acknowledged, and
        tell the bookies so (the LAC): tailing readers can then read every record appended, even
        if this writer goes quiet with no event loop running (the sync facade between calls)."""
        self._flush()
        pending = [b.done for b in self._inflight]
        if pending:
            await asyncio.gather(*pending)
        if self._error is not None:
            raise self._error
        if not self._inflight:
            await self._seg.lh.publish_lac()

    async def close(self) -> None:
        """Flush, close the segment's ledger and seal the segment (the log then has no OPEN
        segment: the next writer needs no recovery), and give up the writer key."""
        if self._closed:
            return
        try:
            if self._error is None:
                self._flush()
                pending = [b.done for b in self._inflight]
                await asyncio.gather(*pending, return_exceptions=True)
                while self._rolling is not None:
                    await asyncio.gather(self._rolling, return_exceptions=True)
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
            if self._error is None:
                seg = self._seg
                await seg.lh.close()
                summary = SegmentSummary(seg.records, seg.bytes, seg.min_ts, seg.max_ts, seg.lh.last_add_confirmed)
                await self._commit([replace(seal(seg.stored, summary), dedup=self._dedup.snapshot())], None, b"")
        finally:
            self._closed = True
            self._logs.bk.store.session.remove_on_new_lease(self._renew_writer_key)
            if self._timer is not None:
                self._timer.cancel()
            if self._next is not None:
                nxt, self._next = self._next, None
                try:
                    await _discard(self._logs, await nxt, self._password)
                except Exception:
                    pass
            try:
                await self._logs.meta.release_writer(self._ref.log_id, self._lease)
            except Exception as e:
                log.info("log %s: could not release the writer key: %s", self.name, e)
        if self._error is not None and not isinstance(self._error, LogFencedError):
            raise self._error

    def abandon(self) -> None:
        """Stop without touching metadata, as a crash would (tests; a closing client)."""
        self._closed = True
        self._logs.bk.store.session.remove_on_new_lease(self._renew_writer_key)
        self._fail(LogClosedError(f"the writer of log {self.name!r} was abandoned"))
        for t in (self._timer, self._rolling, self._failing):
            if t is not None:
                t.cancel()
        self._seg.lh._abandon()

    async def __aenter__(self) -> "LogWriter":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
