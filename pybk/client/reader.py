"""Reading a ledger: entries from their replicas (next replica on error or after a short
speculative delay, digest checked on every read), and the LAC from the bookies.

Every reader takes the client (`bk`: connections, options), the metadata to read by and the
password to verify digests with; what a handle may read (its LAC) is the handle's business."""
from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, AsyncIterator, Callable, Iterable

import numpy as np

from pybk.client.bookie_client import Status
from pybk.entry import DigestMismatch, decode, packed_spans, verify_packed
from pybk.ledger import fragment_pieces, write_set_bookies
from pybk.meta.ledgers import LedgerMetadata

from .errors import (AccessDeniedError, BKError, BookieUnavailableError, DigestMismatchError,
                     NoSuchEntryError, UnauthorizedError, status_of)
from .quorum import fencing_complete
from .types import EntryChunk, LedgerEntry

if TYPE_CHECKING:
    from .bookkeeper import BookKeeper

log = logging.getLogger("pybk.client")

CHUNK = 2048      # entries per streamed range read (one gRPC call)
WINDOW = 64       # per-entry reads in flight (striped ensembles, short ranges, fallbacks)
STREAM_MIN = 16   # shorter ranges are read entry by entry (speculative reads, lowest latency)


_ABSENT = (Status.NO_ENTRY, Status.NO_LEDGER)   # the bookie answered: it holds no such entry


async def _client(bk: "BookKeeper", bookie: str):
    return bk.cached_client(bookie) or await bk.client(bookie)


def _verify(bk: "BookKeeper", md: LedgerMetadata, password: bytes, bookie: str, entry_id: int,
            body: bytes) -> bytes:
    try:
        return decode(body, md.digest_type, password, ledger_id=md.ledger_id, entry_id=entry_id)[1]
    except DigestMismatch as e:
        bk.digest_mismatches += 1
        log.warning("ledger %d entry %d: corrupt replica on bookie %s (%s); reading another replica",
                    md.ledger_id, entry_id, bookie, e,
                    extra={"ledger_id": md.ledger_id, "entry_id": entry_id, "bookie": bookie})
        raise


async def read_one(bk: "BookKeeper", md: LedgerMetadata, password: bytes, entry_id: int, ensemble: list[str],
                   avoid: str | None = None) -> bytes:
    """One entry's payload from its write set: the first replica, then the next on an error or
    once `speculative_read_delay` passes without an answer; the first verified copy wins.
    `avoid` (a bookie that just failed) is tried last."""
    replicas = write_set_bookies(entry_id, ensemble, md.write_quorum)
    if avoid in replicas:
        replicas.remove(avoid)
        replicas.append(avoid)

    async def one(bookie: str) -> bytes:
        c = await _client(bk, bookie)
        async with asyncio.timeout(bk.options.read_timeout):
            body = await c.read(md.ledger_id, entry_id)
        return _verify(bk, md, password, bookie, entry_id, body)

    tasks: dict[asyncio.Task, str] = {}
    errors: list[tuple[str, BaseException]] = []
    nxt = 0
    try:
        while True:
            if nxt < len(replicas):  # the first replica, or the next after an error or a slow answer
                t = asyncio.ensure_future(one(replicas[nxt]))
                tasks[t] = replicas[nxt]
                nxt += 1
            if not tasks:
                break
            timeout = bk.options.speculative_read_delay if nxt < len(replicas) else None
            done, _ = await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                bookie = tasks.pop(t)
                if t.exception() is None:
                    return t.result()
                errors.append((bookie, t.exception()))
    finally:
        for t in tasks:
            t.cancel()
    _raise_read_failure(md.ledger_id, entry_id, errors)


def _raise_read_failure(ledger_id: int, entry_id: int, errors: list[tuple[str, BaseException]]):
    codes = [status_of(e) for _, e in errors]
    detail = "; ".join(f"{b}: {c.name if c is not None else type(e).__name__} {e}"
                       for (b, e), c in zip(errors, codes))
    if errors and all(c in _ABSENT for c in codes):
        raise NoSuchEntryError(f"entry {entry_id} of ledger {ledger_id} is on none of its replicas ({detail})")
    if Status.UNAUTHORIZED in codes:
        raise UnauthorizedError(f"reading entry {entry_id} of ledger {ledger_id}: {detail}")
    if Status.ACCESS_DENIED in codes:
        raise AccessDeniedError(f"reading entry {entry_id} of ledger {ledger_id}: {detail}")
    if errors and all(isinstance(e, DigestMismatch) for _, e in errors):
        raise DigestMismatchError(f"entry {entry_id} of ledger {ledger_id} is corrupt on every replica ({detail})")
    raise BookieUnavailableError(f"no replica of entry {entry_id} of ledger {ledger_id} could be read ({detail})")


def verified_payloads(bk: "BookKeeper", md: LedgerMetadata, password: bytes, bookie: str, bodies: bytes,
                      sizes, first: int, step: int) -> tuple[list[bytes], bool]:
    """(the payloads of the verified bodies, True if all were intact): entries first, first + step,
    ... packed as `bookie` sent them; a corrupt one is counted and logged, and ends the list."""
    payloads, bad = verify_packed(bodies, sizes, first, step, md.ledger_id, md.digest_type, password)
    _count_corrupt(bk, md, bookie, first + len(payloads) * step, bad)
    return payloads, bad is None


def verified_spans(bk: "BookKeeper", md: LedgerMetadata, password: bytes, bookie: str, bodies: bytes | memoryview,
                   sizes, first: int, step: int) -> tuple[np.ndarray, np.ndarray, bool]:
    """verified_payloads in place: (starts, ends, intact), payload i being bodies[starts[i]:ends[i]]."""
    starts, ends, bad = packed_spans(bodies, sizes, first, step, md.ledger_id, md.digest_type, password)
    _count_corrupt(bk, md, bookie, first + len(starts) * step, bad)
    return starts, ends, bad is None


def _count_corrupt(bk: "BookKeeper", md: LedgerMetadata, bookie: str, entry_id: int,
                   bad: DigestMismatch | None) -> None:
    """Count and log a corrupt body of a bookie's answer (bad: None when all were intact)."""
    if bad is not None:
        bk.digest_mismatches += 1
        log.warning("ledger %d entry %d: corrupt replica on bookie %s (%s); reading another replica",
                    md.ledger_id, entry_id, bookie, bad, extra={"ledger_id": md.ledger_id, "bookie": bookie})


async def _stream_chunk(bk: "BookKeeper", md: LedgerMetadata, password: bytes, a: int, b: int, bookie: str,
                        step: int = 1) -> list[tuple[bytes | memoryview, np.ndarray, np.ndarray]]:
    """Entries a, a+step, ... <= b streamed from one bookie (which holds them all), verified, one
    (bodies, payload starts, payload ends) per answer of the bookie (verified_spans). Stops
    early, with fewer entries, on any error or corrupt entry, or when the bookie is slow to start
    answering (the caller then reads the rest from other replicas)."""
    opts = bk.options
    out: list[tuple[bytes | memoryview, np.ndarray, np.ndarray]] = []
    got = 0
    stream = None
    count = (b - a) // step + 1
    try:
        c = await _client(bk, bookie)
        stream = c.read_packed(md.ledger_id, a, b, step, digests_checked=True)
        first, bodies, sizes = await asyncio.wait_for(stream.__anext__(), max(1.0, opts.speculative_read_delay * 20))
        async with asyncio.timeout(opts.read_timeout + count * 0.001):
            while first == a + got * step:
                starts, ends, intact = verified_spans(bk, md, password, bookie, bodies, sizes[:count - got], first,
                                                      step)
                if len(starts):
                    out.append((bodies, starts, ends))
                    got += len(starts)
                if not intact:
                    break
                if got == count:
                    break
                first, bodies, sizes = await stream.__anext__()
    except (Exception, TimeoutError) as e:
        log.info("ledger %d: range read %d..%d from %s stopped at %d: %r", md.ledger_id, a, b,
                 bookie, a + got * step, e, extra={"ledger_id": md.ledger_id, "entry_range": [a, b], "bookie": bookie})
    finally:
        if stream is not None:
            await stream.aclose()
    return out


def check_range(ledger_id: int, first: int, last: int, limit: int, closed: bool) -> None:
    """Raise NoSuchEntryError unless 0 <= first and last <= limit, the last entry a handle may
    read (the last entry of a closed ledger, else the last add confirmed)."""
    if first < 0:
        raise NoSuchEntryError(f"entry ids start at 0, asked for {first}")
    if last > limit:
        what = "last entry" if closed else "last add confirmed"
        raise NoSuchEntryError(f"cannot read ledger {ledger_id} up to entry {last}: its {what} is {limit}")


async def read_entries(bk: "BookKeeper", md: LedgerMetadata, password: bytes, first: int,
                       last: int) -> AsyncIterator[LedgerEntry]:
    """Entries first..last in order (read_chunks, one entry at a time)."""
    async for chunk in read_chunks(bk, md, password, first, last):
        for entry in chunk.entries():
            yield entry


async def read_chunks(bk: "BookKeeper", md: LedgerMetadata, password: bytes, first: int,
                      last: int, stream_min: int = STREAM_MIN) -> AsyncIterator[EntryChunk]:
    """Entries first..last in order, as chunks of consecutive verified entries. Whole-copy
    ensembles (E = Qw) stream ranges from one replica per CHUNK entries, the next chunk while
    this one is handed out (what a replica did not deliver, from the next replica), each answer
    of the bookie (its bodies in one buffer) becoming one chunk; striped ones stream every
    bookie's share at once (_read_striped); ranges shorter than `stream_min` are read entry by
    entry, a window at a time (a tailing reader streams even a few entries: one call costs less
    than one per entry)."""
    lid = md.ledger_id
    chunk_no = 0
    for a0, b0, ensemble in fragment_pieces(md.fragments, first, last):
        if md.ensemble_size == md.write_quorum and b0 - a0 >= stream_min - 1:
            chunks = []
            for a in range(a0, b0 + 1, CHUNK):
                chunks.append((a, min(b0, a + CHUNK - 1), (chunk_no + a) % len(ensemble)))
                chunk_no += 1

            def first_read(i: int) -> asyncio.Task:
                a, b, choice = chunks[i]
                return asyncio.ensure_future(_stream_chunk(bk, md, password, a, b, ensemble[choice]))

            ahead = first_read(0)  # the next chunk is read while this one is handed out
            try:
                for i, (a, b, choice) in enumerate(chunks):
                    got = await ahead
                    ahead = first_read(i + 1) if i + 1 < len(chunks) else None
                    # the rest of a chunk a replica did not deliver (it lags behind, failed, or
                    # holds a corrupt entry) is streamed from the next replica, as a range again
                    for k in range(len(ensemble)):
                        bookie = ensemble[(choice + k) % len(ensemble)]
                        if k:
                            got = await _stream_chunk(bk, md, password, a, b, bookie)
                        for bodies, starts, ends in got:
                            yield EntryChunk(lid, a, bodies, starts, ends)
                            a += len(starts)
                        if a > b:
                            break
                    if a <= b:  # no replica streamed the rest: entry by entry, with failover
                        async for c in _grouped(lid, _read_each(bk, md, password, a, b, ensemble, avoid=bookie)):
                            yield c
            finally:
                if ahead is not None and not ahead.done():
                    ahead.cancel()
        elif b0 - a0 >= stream_min - 1:
            async for c in _grouped(lid, _read_striped(bk, md, password, a0, b0, ensemble)):
                yield c
        else:
            async for c in _grouped(lid, _read_each(bk, md, password, a0, b0, ensemble)):
                yield c


async def _grouped(ledger_id: int, entries: AsyncIterator[LedgerEntry]) -> AsyncIterator[EntryChunk]:
    """Consecutive entries as chunks of up to CHUNK; on an error, the entries before it first."""
    first, payloads = 0, []
    try:
        async for e in entries:
            if not payloads:
                first = e.entry_id
            payloads.append(e.data)
            if len(payloads) >= CHUNK:
                yield EntryChunk.of_payloads(ledger_id, first, payloads)
                payloads = []
    except Exception:
        if payloads:
            yield EntryChunk.of_payloads(ledger_id, first, payloads)
        raise
    if payloads:
        yield EntryChunk.of_payloads(ledger_id, first, payloads)


async def _read_striped(bk: "BookKeeper", md: LedgerMetadata, password: bytes, a0: int, b0: int,
                        ensemble: list[str]) -> AsyncIterator[LedgerEntry]:
    """Entries a0..b0 of one striped fragment (E > Qw). Entry e is stored first on bookie
    e % E, so bookie i streams the entries e = i (mod E) of a chunk (a read with step = E),
    all E bookies at once; the streams are merged in entry order. Whatever a stream did not
    deliver (error, corrupt entry, stall) is read entry by entry from the other replicas."""
    lid = md.ledger_id
    n = len(ensemble)
    a = a0
    while a <= b0:
        b = min(b0, a + CHUNK * n - 1)
        starts = [a + (i - a) % n for i in range(n)]   # bookie i's first entry in a..b
        got = [[p for bodies, s, e in pieces for p in EntryChunk(md.ledger_id, 0, bodies, s, e).payloads()]
               for pieces in await asyncio.gather(
            *(_stream_chunk(bk, md, password, starts[i], b, ensemble[i], n) for i in range(n)))]
        missing = [e for e in range(a, b + 1) if (e - starts[e % n]) // n >= len(got[e % n])]
        rest = _read_each_of(bk, md, password, missing, ensemble, avoid=lambda e: ensemble[e % n]) if missing else None
        try:
            for e in range(a, b + 1):
                i = e % n
                k = (e - starts[i]) // n
                if k < len(got[i]):
                    yield LedgerEntry(lid, e, got[i][k])
                else:
                    yield await anext(rest)
        finally:
            if rest is not None:
                await rest.aclose()
        a = b + 1


async def _read_each(bk: "BookKeeper", md: LedgerMetadata, password: bytes, a: int, b: int, ensemble: list[str],
                     avoid: str | None = None) -> AsyncIterator[LedgerEntry]:
    async for e in _read_each_of(bk, md, password, range(a, b + 1), ensemble, lambda _: avoid):
        yield e


async def _read_each_of(bk: "BookKeeper", md: LedgerMetadata, password: bytes, ids: Iterable[int],
                        ensemble: list[str], avoid: Callable[[int], str | None]) -> AsyncIterator[LedgerEntry]:
    """Entries `ids` (ascending) by per-entry reads, WINDOW in flight; `avoid(e)` names a
    bookie to try last for entry e (one that just failed), or None."""
    lid = md.ledger_id
    window: list[tuple[int, asyncio.Task]] = []
    it = iter(ids)
    nxt = next(it, None)
    try:
        while nxt is not None or window:
            while nxt is not None and len(window) < WINDOW:
                window.append((nxt, asyncio.ensure_future(read_one(bk, md, password, nxt, ensemble, avoid(nxt)))))
                nxt = next(it, None)
            eid, t = window.pop(0)
            yield LedgerEntry(lid, eid, await t)
    finally:
        for _, t in window:
            t.cancel()


async def read_lac(bk: "BookKeeper", md: LedgerMetadata) -> int:
    """Max LAC from bookies of the last fragment covering every write quorum with Qw - Qa + 1
    answers (so it is at least every LAC a writer acked and piggybacked)."""
    ensemble = list(md.fragments[-1].bookies)
    lid = md.ledger_id

    async def one(i: int) -> tuple[int, int]:
        c = await _client(bk, ensemble[i])
        try:
            return i, await asyncio.wait_for(c.read_lac(lid), bk.options.read_timeout)
        except BKError:
            raise
        except Exception as e:
            if status_of(e) in _ABSENT:
                return i, -1
            raise

    answers: dict[int, int] = {}
    errors: list[str] = []
    denied = False
    for fut in asyncio.as_completed([one(i) for i in range(len(ensemble))]):
        try:
            i, lac = await fut
            answers[i] = lac
        except Exception as e:
            errors.append(str(e))
            denied = denied or status_of(e) is Status.ACCESS_DENIED
            continue
    if not fencing_complete(md.ensemble_size, md.write_quorum, md.ack_quorum, answers):
        if denied:
            raise AccessDeniedError(f"ledger {lid}: reading the LAC was refused ({'; '.join(errors)})")
        raise BookieUnavailableError(f"ledger {lid}: only {len(answers)} of {len(ensemble)} bookies answered "
                                     f"for the LAC, not enough to cover every write quorum ({'; '.join(errors)})")
    return max(answers.values())


async def wait_lac(bk: "BookKeeper", md: LedgerMetadata, previous: int, timeout: float,
                   learn: Callable[[int], int]) -> None:
    """Long-poll the bookies of the last fragment for a LAC above `previous`. Each LAC a bookie
    reports goes to `learn`, which returns the best LAC known (`learn(-1)` only asks: a LAC
    never falls); stop once that is above `previous` or at `timeout`. BookieUnavailableError
    if it is not and no bookie answered."""
    lid = md.ledger_id

    async def one(bookie: str) -> int:
        c = await _client(bk, bookie)
        return await c.wait_lac(lid, previous, timeout)

    tasks = [asyncio.ensure_future(one(b)) for b in md.fragments[-1].bookies]
    errors: list[str] = []
    try:
        pending = set(tasks)
        async with asyncio.timeout(timeout + 5.0):
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    if t.exception() is None:
                        learn(t.result())
                    elif status_of(t.exception()) not in _ABSENT:
                        errors.append(str(t.exception()))
                if learn(-1) > previous:
                    break
    except TimeoutError:
        pass
    finally:
        for t in tasks:
            if not t.done():
                t.cancel()
            elif not t.cancelled():
                t.exception()
    if learn(-1) <= previous and len(errors) == len(tasks):
        raise BookieUnavailableError(f"ledger {lid}: no bookie of {md.fragments[-1].bookies} answered the "
                                     f"LAC long-poll ({'; '.join(errors)})")


async def follow_lac(bk: "BookKeeper", md: LedgerMetadata, bookie: str, previous: int, timeout: float
                     ) -> AsyncIterator[tuple[int, int, bytes, list[int]]]:
    """One bookie's LAC at each rise past `previous`, with the entries it holds after the LAC it
    told before, for `timeout` seconds (BookieClient.follow_lac: their bodies unverified, see
    verified_payloads)."""
    return (await _client(bk, bookie)).follow_lac(md.ledger_id, previous, timeout)


def absent(exc: BaseException) -> bool:
    """Whether an error is a bookie's answer that it holds no such ledger or entry."""
    return status_of(exc) in _ABSENT
