"""`LedgerHandle`: one ledger, open for writing (its single writer) or for reading.

The write path: each add gets the next entry id, is encoded with the current LAC and sent
to its write set; acks complete futures in entry order (AckTracker). A bookie that fails
or times out is replaced by an ensemble change: a CAS appending a fragment at the first
un-acked entry, then pending entries are resent to the new bookies.
"""
from __future__ import annotations

import asyncio
import logging
import time
from functools import partial
from typing import TYPE_CHECKING, AsyncIterator

from pybk.entry import encode, master_key
from pybk.meta.ledgers import LedgerMetadata

from . import reader
from .close import CloseOutcome, close_at
from .ensemble_change import EnsembleChange, change_ensemble, not_open_error
from .errors import (AccessDeniedError, BKError, LedgerClosedError, LedgerFencedError,
                     NotEnoughBookiesError, UnauthorizedError, status_of)
from .quorum import AckTracker, first_copies, write_quorums
from .reaction import Reaction, reaction
from .types import EntryChunk, LedgerEntry

if TYPE_CHECKING:
    from .bookie_client import BookieClient

log = logging.getLogger("pybk.client")

# turns of the loop between an add's ack and the next add of a writer that awaits each one: the
# ack's callbacks, the awaiting task, and a log writer's send of its entry
LAC_TURNS = 3


class _Pending:
    __slots__ = ("entry_id", "body", "size", "future", "sent_at")

    def __init__(self, entry_id: int, body: bytes, size: int, future: asyncio.Future, sent_at: float):
        self.entry_id = entry_id
        self.body = body
        self.size = size
        self.future = future
        self.sent_at = sent_at


class LedgerHandle:
    """A ledger open for writing (from `create_ledger`) or reading (from `open_ledger`)."""

    def __init__(self, bk, md, password: bytes, writable: bool):
        self._bk = bk
        self._md = md
        self.password = password
        self.master_key = master_key(password)
        self.writable = writable
        self._closed = md.is_closed
        self._lac = md.last_entry_id if self._closed else -1
        self._error: BKError | None = None
        if writable:
            e, qw, qa = md.ensemble_size, md.write_quorum, md.ack_quorum
            self._tracker = AckTracker(e, qw, qa)
            self._ws = write_quorums(e, qw)
            self._pending: list[_Pending] = []
            self._head = 0                         # index of the first live item in _pending
            self._length = 0                       # bytes of the acked entries
            self._sent_length = 0                  # bytes of every entry added: each header's running length
            self._ensemble = list(md.fragments[-1].bookies)
            self._clients: list = [None] * e
            self._sinks: list = []                 # per ensemble index: where its bookie's answers go
            self._new_sinks()
            self._failed: set[int] = set()         # ensemble indices being replaced
            self._failed_ids: set[str] = set()     # every bookie this writer gave up on
            self._changing: asyncio.Task | None = None
            self._acked_during_change: list[tuple[int, bytes]] = []
            self._lac_timer: asyncio.Handle | None = None
            self._lac_writes = 0                   # WriteLac calls not answered yet
            # a lone add's copies beyond the ack quorum: sent once it is acked (they then ride in
            # the next add's messages), after tail_hold_delay, or when a bookie fails
            self._hold_delay = bk.options.tail_hold_delay if qw > qa else 0.0
            self._held: tuple[int, bytes, list[int]] | None = None  # (entry id, body, indices)
            self._held_timer: asyncio.TimerHandle | None = None
            self._lac_told = -1
            self._closing = False
            self._watchdog: asyncio.Task | None = None
            self._loop = asyncio.get_running_loop()

    # ---- properties ---------------------------------------------------------------------

    @property
    def ledger_id(self) -> int:
        return self._md.ledger_id

    @property
    def metadata(self) -> LedgerMetadata:
        """The ledger metadata as this handle last saw it."""
        return self._md

    @property
    def last_add_confirmed(self) -> int:
        """The last entry known to be acked (the last entry, for a closed ledger)."""
        return self._tracker.lac if self.writable else self._lac

    @property
    def is_closed(self) -> bool:
        return self._closed

    @property
    def length(self) -> int:
        return self._length if self.writable else self._md.length

    # ---- writing ------------------------------------------------------------------------

    async def _connect_ensemble(self) -> None:
        results = await asyncio.gather(*(self._bk.client(b) for b in self._ensemble), return_exceptions=True)
        for i, r in enumerate(results):
            if isinstance(r, BaseException):
                self._bookie_failed(i, r)
            else:
                self._clients[i] = r
        self._watchdog = asyncio.ensure_future(self._watch_timeouts())

    async def add_entry(self, data: bytes) -> int:
        """Append `data`; returns its entry id once it is acked (Qa copies, all before it acked)."""
        return await self.add_entry_async(data)

    def add_entry_async(self, data: bytes) -> asyncio.Future:
        """Append `data` without waiting: returns a future of its entry id. Adds are pipelined
        and acked in order."""
        if not self.writable:
            fut = asyncio.get_running_loop().create_future()
            fut.set_exception(LedgerClosedError(f"ledger {self.ledger_id} was opened for reading only"))
            return fut
        fut = self._loop.create_future()
        if self._error is not None:
            fut.set_exception(self._error)
            return fut
        if self._closing or self._closed:
            fut.set_exception(LedgerClosedError(f"ledger {self.ledger_id} is closed"))
            return fut
        if type(data) is not bytes:
            if not isinstance(data, (bytes, bytearray, memoryview)):
                fut.set_exception(TypeError(f"entry data must be bytes, not {type(data).__name__}"))
                return fut
            data = bytes(data)
        t = self._tracker
        eid = t.add()
        lac = t.lac
        md = self._md
        lid = md.ledger_id
        self._sent_length += len(data)
        body = encode(lid, eid, lac, data, md.digest_type, self.password, self._sent_length)
        self._lac_told = lac
        lone = self._head == len(self._pending)
        self._pending.append(_Pending(eid, body, len(data), fut, time.monotonic()))
        failed, clients, sinks, mk = self._failed, self._clients, self._sinks, self.master_key
        ws = self._ws[eid % md.ensemble_size]
        if lone and self._hold_delay and not failed:
            ws, held = first_copies(ws, md.ack_quorum, [c is None or c.busy for c in clients])
            self._held = (eid, body, held)
            self._held_timer = self._loop.call_later(self._hold_delay, self._release_held)
        elif self._held is not None:  # adds overlap now: the held copies go with this one's
            self._release_held()
        for idx in ws:
            c = clients[idx]
            if c is not None and idx not in failed:
                c.add_to_run(lid, eid, body, mk, False, sinks[idx])
        return fut

    def _release_held(self) -> None:
        """Send the held copies of the last lone add (see _held) to their bookies."""
        held, self._held = self._held, None
        if self._held_timer is not None:
            self._held_timer.cancel()
            self._held_timer = None
        if held is None or self._error is not None:
            return
        eid, body, indices = held
        for idx in indices:
            self._send(idx, eid, body)

    def _new_sinks(self) -> None:
        """One sink per ensemble index, bound to its bookie: a run's answer from a bookie that was
        replaced since finds another bookie at its index and is ignored."""
        self._sinks = [partial(self._on_run_done, idx, bookie) for idx, bookie in enumerate(self._ensemble)]

    def _send(self, idx: int, eid: int, body: bytes) -> None:
        c = self._clients[idx]
        if c is None or idx in self._failed:
            return
        c.add_to_run(self._md.ledger_id, eid, body, self.master_key, False, self._sinks[idx])

    def _stale(self, idx: int, bookie: str) -> bool:
        """An answer from a bookie this writer already replaced (or is replacing), or after the
        handle failed or closed: it changes nothing."""
        return self._ensemble[idx] != bookie or idx in self._failed or self._error is not None or self._closed

    def _on_run_done(self, idx: int, bookie: str, acked, failed) -> None:
        """A bookie's answer to a run of adds: the acked ones count in one step, then each other
        one is handled as its error says (_on_add_done)."""
        if self._stale(idx, bookie):
            return
        if acked:
            t = self._tracker
            old = t.lac
            if t.ack_many(acked, idx) != old:
                self._complete_acked()
        for eid, exc in failed:
            self._on_add_done(idx, bookie, eid, exc)

    def _on_add_done(self, idx: int, bookie: str, eid: int, exc: BaseException | None) -> None:
        if self._stale(idx, bookie):
            return
        if exc is None:
            t = self._tracker
            old = t.lac
            if t.ack(eid, idx) != old:
                self._complete_acked()
            return
        what = reaction(status_of(exc))
        if what is Reaction.FENCED:
            self._fail(LedgerFencedError(
                f"ledger {self.ledger_id} was fenced by a recovery (bookie {bookie} refused entry {eid}); "
                f"pending adds may or may not be stored: open the ledger to see"))
        elif what is Reaction.UNAUTHORIZED:
            self._fail(UnauthorizedError(f"bookie {bookie} refused the master key of ledger {self.ledger_id}"))
        elif what is Reaction.DENIED:
            self._fail(AccessDeniedError(f"bookie {bookie} refused to add to ledger {self.ledger_id}: "
                                         f"{getattr(exc, 'message', exc)}"))
        elif what is Reaction.EXISTS:
            self._fail(BKError(f"bookie {bookie} already holds entry {eid} of ledger {self.ledger_id} with other "
                               f"bytes (entries are write-once: another writer wrote this ledger?); this handle can "
                               f"add no more: {getattr(exc, 'message', exc)}"))
        elif what is Reaction.REFUSED:
            self._fail(BKError(f"bookie {bookie} refused entry {eid} of ledger {self.ledger_id} as a bad "
                               f"request ({getattr(exc, 'message', exc)}); this handle can add no more"))
        elif what is Reaction.RESEND_LATER:
            self._loop.call_later(0.01, self._resend_if_pending, idx, eid)
        else:
            self._bookie_failed(idx, exc)

    def _resend_if_pending(self, idx: int, eid: int) -> None:
        if self._error is None and eid in self._tracker.pending and idx not in self._failed:
            p = self._pending[self._head + eid - self._tracker.lac - 1]
            self._send(idx, eid, p.body)

    def _complete_acked(self) -> None:
        lac = self._tracker.lac
        pending, head = self._pending, self._head
        keep = self._changing is not None
        while head < len(pending) and pending[head].entry_id <= lac:
            p = pending[head]
            pending[head] = None
            head += 1
            self._length += p.size
            if keep:
                self._acked_during_change.append((p.entry_id, p.body))
            if not p.future.done():
                p.future.set_result(p.entry_id)
        if head > 1024 and head * 2 > len(pending):
            del pending[:head]
            head = 0
        self._head = head
        if self._held is not None and self._held[0] <= lac:
            self._release_held()
        self._arm_lac()

    def _live_clients(self) -> list[tuple[int, BookieClient]]:
        """(ensemble index, client) of every bookie of the ensemble this writer has not given up on."""
        return [(idx, c) for idx, c in enumerate(self._clients) if c is not None and idx not in self._failed]

    def _live_pending(self) -> list[_Pending]:
        return self._pending[self._head:]

    def _arm_lac(self) -> None:
        """Adds went idle with a LAC no add carried yet: tell the bookies after explicit_lac_delay,
        or with no delay LAC_TURNS turns of the loop on, so that a writer awaiting each add (or a
        log append) makes its next one first, which then carries the LAC instead."""
        if self._lac_timer is None and self._head == len(self._pending) and self._tracker.lac > self._lac_told \
                and self._error is None and not self._closed:
            delay = self._bk.options.explicit_lac_delay
            self._lac_timer = self._loop.call_later(delay, self._flush_lac) if delay else \
                self._loop.call_soon(self._lac_turn, LAC_TURNS - 1)

    def _lac_turn(self, left: int) -> None:
        """One of the LAC_TURNS turns of the loop before an idle writer's WriteLac."""
        self._lac_timer = self._loop.call_soon(self._lac_turn, left - 1) if left else None
        if not left:
            self._flush_lac()

    def _flush_lac(self) -> None:
        """Adds went idle: the last LAC rode on no entry yet, so tell the bookies explicitly
        (tailing readers can then read up to the last acked entry). One WriteLac round at a
        time: a LAC that rises meanwhile is told when its answers are in (or by the next add)."""
        self._lac_timer = None
        lac = self._tracker.lac
        if lac <= self._lac_told or self._error is not None or self._head != len(self._pending) \
                or self._lac_writes:
            return
        self._lac_told = lac
        for _, c in self._live_clients():
            t = asyncio.ensure_future(c.write_lac(self._md.ledger_id, lac, self.master_key))
            self._lac_writes += 1
            t.add_done_callback(self._lac_written)

    def _lac_written(self, t: asyncio.Future) -> None:
        """A bookie answered a WriteLac: once all have, a LAC that rose meanwhile goes out."""
        t.cancelled() or t.exception()
        self._lac_writes -= 1
        if not self._lac_writes:
            self._arm_lac()

    async def publish_lac(self) -> None:
        """Tell the ensemble's bookies the LAC now and wait for their answers, instead of after
        `explicit_lac_delay` of idle adds: a writer about to go quiet with no event loop running
        (a sync caller, a Spark driver between micro-batches) leaves every acked entry readable
        by tailing readers. A bookie that does not take it is logged; readers then learn the LAC
        from the others or from the next add."""
        if self._held is not None:
            self._release_held()
        if self._lac_timer is not None:
            self._lac_timer.cancel()
            self._lac_timer = None
        lac = self._tracker.lac
        if lac < 0 or self._error is not None or not self.writable:
            return
        self._lac_told = max(self._lac_told, lac)
        live = self._live_clients()
        results = await asyncio.gather(*(c.write_lac(self.ledger_id, lac, self.master_key) for _, c in live),
                                       return_exceptions=True)
        for (idx, _), r in zip(live, results):
            if isinstance(r, BaseException):
                log.info("ledger %d: bookie %s did not take LAC %d: %s", self.ledger_id, self._ensemble[idx], lac, r,
                         extra={"ledger_id": self.ledger_id})

    def _fail(self, error: BKError, quiet: bool = False) -> None:
        """The handle can no longer write: fail every pending and future add with `error` (logged
        as a warning, or with `quiet`, when no add is lost, at info level)."""
        if self._error is None:
            self._error = error
            log.log(logging.INFO if quiet else logging.WARNING, "ledger %d: %s", self.ledger_id, error,
                    extra={"ledger_id": self.ledger_id})
        for p in self._live_pending():
            if not p.future.done():
                p.future.set_exception(error)
                p.future.exception()  # mark retrieved: callers of add_entry_async may drop it
        self._pending, self._head = [], 0
        self._release_held()

    def _bookie_failed(self, idx: int, reason: object) -> None:
        if idx in self._failed or self._error is not None or self._closed:
            return
        bookie = self._ensemble[idx]
        log.warning("ledger %d: bookie %s (index %d) failed an add: %s; changing the ensemble",
                    self.ledger_id, bookie, idx, reason, extra={"ledger_id": self.ledger_id, "bookie": bookie})
        self._failed.add(idx)
        self._failed_ids.add(bookie)
        self._release_held()  # the held copies may be what completes the ack quorum now
        if self._changing is None:
            self._changing = asyncio.ensure_future(self._change_ensemble())

    def _degraded_ok(self) -> bool:
        """Every write quorum still has Qa healthy bookies, so adds can complete without a
        replacement (they are under-replicated until one is found)."""
        md = self._md
        return all(sum(1 for i in q if i not in self._failed) >= md.ack_quorum
                   for q in write_quorums(md.ensemble_size, md.write_quorum))

    async def _change_ensemble(self) -> None:
        """Replace failed bookies (ensemble_change) until none is left or the writer fails; with
        too few writable bookies, write on degraded while every write quorum keeps Qa."""
        try:
            while self._failed and self._error is None:
                try:
                    change = await change_ensemble(self._bk, self._md, self._ensemble, set(self._failed),
                                                   self._tracker.lac + 1, set(self._failed_ids))
                except NotEnoughBookiesError as e:
                    if not self._degraded_ok():
                        self._fail(e)
                        return
                    log.warning("ledger %d: %s; writing on with %d of %d bookies, retrying in 1s",
                                self.ledger_id, e, self._md.ensemble_size - len(self._failed),
                                self._md.ensemble_size, extra={"ledger_id": self.ledger_id})
                    await asyncio.sleep(1.0)
                    continue
                self._md = change.metadata
                if change.not_open is not None:
                    self._fail(not_open_error(change.metadata))
                    return
                self._apply_ensemble_change(change)
        except Exception as e:  # metadata unreachable etc.: the writer cannot safely go on
            log.exception("ledger %d: ensemble change failed", self.ledger_id, extra={"ledger_id": self.ledger_id})
            self._fail(e if isinstance(e, BKError) else BKError(f"ensemble change of ledger {self.ledger_id} failed: {e}"))
        finally:
            self._changing = None
            self._acked_during_change = []

    def _apply_ensemble_change(self, change: EnsembleChange) -> None:
        """Switch to the stored ensemble and send the new bookies their share of every entry
        from the new fragment on (acked meanwhile, or still pending)."""
        md, replace = change.metadata, change.replaced
        self._ensemble = list(md.current_ensemble)
        self._new_sinks()
        for i, c in change.clients.items():
            self._clients[i] = c
            if c is None:
                self._failed_ids.add(self._ensemble[i])
        self._tracker.forget(replace)
        self._failed -= replace
        now = time.monotonic()
        first = md.fragments[-1].first_entry_id
        e_size = md.ensemble_size
        for eid, body in self._acked_during_change:
            if eid >= first:
                for idx in self._ws[eid % e_size]:
                    if idx in replace:
                        self._send(idx, eid, body)
        self._acked_during_change = []
        for p in self._live_pending():
            p.sent_at = now
            for idx in self._ws[p.entry_id % e_size]:
                if idx in replace:
                    self._send(idx, p.entry_id, p.body)
        for i, c in change.clients.items():
            if c is None:
                self._bookie_failed_later(i)

    def _bookie_failed_later(self, idx: int) -> None:
        self._loop.call_soon(self._bookie_failed, idx, "unreachable replacement")

    async def _watch_timeouts(self) -> None:
        """Replace bookies that leave the oldest pending add unanswered for add_timeout."""
        timeout = self._bk.options.add_timeout
        while not self._closed and self._error is None:
            await asyncio.sleep(min(1.0, timeout / 4))
            live = self._live_pending()
            if not live or self._changing is not None:
                continue
            oldest = live[0]
            if time.monotonic() - oldest.sent_at < timeout:
                continue
            acked = self._tracker.acks(oldest.entry_id)
            for idx in self._ws[oldest.entry_id % self._md.ensemble_size]:
                if idx not in acked:
                    self._bookie_failed(idx, f"no answer to entry {oldest.entry_id} within {timeout:.1f}s")

    async def close(self) -> None:
        """Close the ledger: wait for pending adds, then CAS it CLOSED at the LAC.

        A lost CAS is decided as docs/protocol.md says (close.after_close_conflict): still OPEN ->
        retry; IN_RECOVERY -> fenced error; CLOSED at our LAC -> done; CLOSED elsewhere -> error."""
        if self._closed:
            return
        if not self.writable:
            self._closed = True
            return
        self._closing = True
        live = [p.future for p in self._live_pending()]
        if live:
            await asyncio.gather(*live, return_exceptions=True)
        if self._changing is not None:  # nothing is pending: a change still running (e.g. waiting
            self._changing.cancel()       # for a replacement bookie) has nothing left to do
            await asyncio.gather(self._changing, return_exceptions=True)
        if self._lac_timer is not None:
            self._lac_timer.cancel()
            self._lac_timer = None
        if self._watchdog is not None:
            self._watchdog.cancel()
        lac = self._tracker.lac
        result = await self._bk.store.ledgers.update(self.ledger_id, close_at(lac, self._length), current=self._md)
        self._md = result.metadata
        self._closed = True
        if result.reason is CloseOutcome.IN_RECOVERY:
            raise LedgerFencedError(f"cannot close ledger {self.ledger_id}: a reader is recovering it "
                                    f"(this writer acked up to entry {lac})")
        if result.reason is CloseOutcome.MISMATCH:
            raise LedgerClosedError(
                f"ledger {self.ledger_id} was closed by someone else at last entry {result.metadata.last_entry_id}, "
                f"but this writer acked up to entry {lac}")
        self._lac = lac

    def _abandon(self) -> None:
        """Stop background work without touching metadata (the BookKeeper is closing)."""
        if not self.writable or self._closed:
            return
        self._fail(LedgerClosedError(f"the client of ledger {self.ledger_id} was closed before the ledger"),
                   quiet=not self._live_pending())
        for t in (self._watchdog, self._changing):
            if t is not None:
                t.cancel()
        if self._lac_timer is not None:
            self._lac_timer.cancel()
            self._lac_timer = None

    async def __aenter__(self) -> "LedgerHandle":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # ---- reading ------------------------------------------------------------------------

    def _check_range(self, first: int, last: int) -> None:
        reader.check_range(self.ledger_id, first, last, self.last_add_confirmed, self._closed)

    def read_entries(self, first: int, last: int) -> AsyncIterator[LedgerEntry]:
        """Entries first..last (inclusive), in order, digest-verified; last may not pass the LAC."""
        self._check_range(first, last)
        return reader.read_entries(self._bk, self._md, self.password, first, last)

    def read_chunks(self, first: int, last: int) -> AsyncIterator[EntryChunk]:
        """read_entries as chunks of consecutive entries in one buffer each (no object per entry:
        for bulk readers such as a Spark scan); same checks, same order."""
        self._check_range(first, last)
        return reader.read_chunks(self._bk, self._md, self.password, first, last)

    async def read_entry(self, entry_id: int) -> bytes:
        """One entry's payload (no range machinery: the lowest-latency read)."""
        self._check_range(entry_id, entry_id)
        md = self._md
        return await reader.read_one(self._bk, md, self.password, entry_id, md.ensemble_for(entry_id))

    async def read_last_add_confirmed(self) -> int:
        """Ask the bookies of the last fragment for their LAC; the max of a covering quorum."""
        if self._closed:
            return self._md.last_entry_id
        if self.writable:
            return self.last_add_confirmed
        md = await self.refresh_metadata()       # a newer fragment, or the ledger was closed meanwhile
        if self._closed:
            return md.last_entry_id
        return self._learn_lac(await reader.read_lac(self._bk, md))

    async def wait_last_add_confirmed(self, previous: int, timeout: float = 10.0) -> int:
        """Long-poll: return as soon as the LAC passes `previous`, or the LAC at `timeout`."""
        if self._closed or self.last_add_confirmed > previous:
            return self.last_add_confirmed
        md = await self.refresh_metadata() if not self.writable else self._md
        if self._closed or self.last_add_confirmed > previous:
            return self.last_add_confirmed
        await reader.wait_lac(self._bk, md, previous, timeout, self._learn_lac)
        return self.last_add_confirmed

    def _learn_lac(self, lac: int) -> int:
        """Take a LAC a bookie reported (a reader's only grows); returns the LAC now known."""
        if not self.writable and not self._closed and lac > self._lac:
            self._lac = lac
        return self.last_add_confirmed

    async def refresh_metadata(self) -> LedgerMetadata:
        """Re-read the metadata (a tailing reader learns here that the ledger was closed)."""
        md = await self._bk.ledger_metadata(self.ledger_id)
        if not self.writable:
            self._md = md
            if md.is_closed:
                self._closed = True
                self._lac = md.last_entry_id
        return md
