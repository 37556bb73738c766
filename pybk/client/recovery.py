"""Fencing and recovery of an open ledger (docs/protocol.md), as a reader that takes over:

1. CAS the metadata to IN_RECOVERY (the old writer's next ensemble change or close fails);
2. fence every bookie of the last fragment until each write quorum has Qw - Qa + 1 answers
   (the old writer can then get no add acked); take the max LAC they report;
3. read forward from LAC + 1 in batches of `recovery_batch_size` entries (fewer when entries are
   large: `next_batch_size`), streamed from one
   replica per stripe (the next batch is read while one is re-written); an entry found anywhere
   is re-written to its whole write quorum with the recovery flag; stop at the first entry that
   Qw - Qa + 1 replicas lack (asked of its whole write quorum);
4. when fewer than Qa bookies store a re-written entry, replace the failed bookies from that
   entry on (`recovery_fragment`, the writer's placement rule) and re-write there;
5. CAS CLOSED at the last entry found, with the fragments of step 4 appended in the same CAS.
   Concurrent recoveries converge: each step is a CAS or idempotent, and a recovery that loses
   the final CAS adopts the winner's closed metadata.

Step 4's fragments are stored only with the close: stored while IN_RECOVERY, a second recovery
would fence and read the new bookies, and their NO_ENTRY for an entry not re-written yet would
count towards "does not exist", closing the ledger before acked entries. Until the close, the
metadata names the fenced ensemble, which holds every entry recovery reads.

Autorecovery may not know the password, and the metadata does not hold the master key: it
fences and re-writes keyless (an empty key), which bookies accept only from a caller with the
admin role, and, lacking the password, checks MAC entries structurally only (CRC32C is always
verified; entries are copied verbatim, so readers still verify the MAC).
"""
from __future__ import annotations

import asyncio
import logging
from contextlib import aclosing
from typing import Collection, Mapping, Sequence

from pybk.client.bookie_client import Status
from pybk.entry import DigestMismatch, DigestType, decode, parse_header
from pybk.entry import master_key as make_master_key
from pybk.meta.ledgers import Change, Fragment, LedgerMetadata, LedgerState, Unchanged

from .ensemble_change import next_ensemble, with_fragment
from .errors import (AccessDeniedError, LedgerRecoveryError, NotEnoughBookiesError, UnauthorizedError,
                     status_of)
from .quorum import RecoveryDecision, ReplicaAnswer, fencing_complete, recovery_read_decision

log = logging.getLogger("pybk.client")


def to_recovery(md: LedgerMetadata) -> LedgerMetadata | Unchanged[LedgerState]:
    """Step 1 as a metadata change: an OPEN ledger goes IN_RECOVERY; one already IN_RECOVERY
    (another recovery started) or CLOSED stays as it is."""
    if md.state is LedgerState.OPEN:
        return md.replace(state=LedgerState.IN_RECOVERY)
    return Unchanged(md.state)


def close_recovered(last_entry: int, length: int | None, fragments: Sequence[Fragment] = ()) -> Change[LedgerState]:
    """Step 4 as a metadata change: CLOSED at `last_entry` with `length` (None: keep the stored
    length), with the `fragments` recovery re-wrote entries into appended (each from its first
    entry on); a ledger another recovery closed first stays as it is."""
    def change(md: LedgerMetadata) -> LedgerMetadata | Unchanged[LedgerState]:
        if md.is_closed:
            return Unchanged(md.state)
        for f in fragments:
            md = with_fragment(md, f.first_entry_id, f.bookies)
        return md.replace(state=LedgerState.CLOSED, last_entry_id=last_entry,
                          length=md.length if length is None else length)
    return change


async def _fence(bk, md, mk: bytes) -> int:
    """Fence the last fragment's bookies until coverage; returns the max LAC they reported."""
    ensemble = list(md.fragments[-1].bookies)
    lid = md.ledger_id

    async def one(i: int) -> tuple[int, int]:
        c = await bk.client(ensemble[i])
        try:
            return i, await c.fence(lid, mk)
        except Exception as e:
            if status_of(e) is Status.NO_LEDGER:  # never saw an entry; it is fenced now all the same
                return i, -1
            raise

    tasks = [asyncio.ensure_future(one(i)) for i in range(len(ensemble))]
    answers: dict[int, int] = {}
    errors: list[str] = []
    try:
        async with asyncio.timeout(bk.options.fence_timeout):
            for fut in asyncio.as_completed(tasks):
                try:
                    i, lac = await fut
                except Exception as e:
                    if status_of(e) is Status.UNAUTHORIZED:
                        raise UnauthorizedError(f"bookie refused to fence ledger {lid}: wrong password ({e})")
                    if status_of(e) is Status.ACCESS_DENIED:
                        raise AccessDeniedError(f"bookie refused to fence ledger {lid}: {e}")
                    errors.append(str(e))
                    continue
                answers[i] = lac
                if fencing_complete(md.ensemble_size, md.write_quorum, md.ack_quorum, answers):
                    break
    except TimeoutError:
        errors.append(f"timed out after {bk.options.fence_timeout:.0f}s")
    for t in tasks:  # stragglers keep fencing in the background; their results do not matter
        t.add_done_callback(lambda t: t.cancelled() or t.exception())
    if not fencing_complete(md.ensemble_size, md.write_quorum, md.ack_quorum, answers):
        raise LedgerRecoveryError(
            f"cannot fence ledger {lid}: {len(answers)} of {len(ensemble)} bookies of {ensemble} answered, "
            f"every write quorum needs {md.write_quorum - md.ack_quorum + 1} ({'; '.join(errors)})")
    return max(answers.values())


def _corrupt(bk, md: LedgerMetadata, password: bytes | None, bookie: str, entry_id: int, body: bytes) -> str | None:
    """Why a replica's body of the entry is not to be trusted (logged and counted), or None.
    Without the password a MAC digest is checked structurally only (see the module docstring)."""
    try:
        decode(body, md.digest_type, password or b"", ledger_id=md.ledger_id, entry_id=entry_id,
               verify_digest=password is not None or md.digest_type is DigestType.CRC32C)
    except DigestMismatch as e:
        bk.digest_mismatches += 1
        log.warning("recovery of ledger %d: corrupt replica of entry %d on %s: %s", md.ledger_id, entry_id, bookie, e,
                    extra={"ledger_id": md.ledger_id, "entry_id": entry_id, "bookie": bookie})
        return str(e)
    return None


async def _recovery_read(bk, md, password: bytes | None,
                         entry_id: int) -> tuple[RecoveryDecision, bytes | None, str]:
    """Ask the entry's whole write quorum; decide as soon as the answers allow."""
    replicas = md.write_set(entry_id)
    lid = md.ledger_id

    async def one(bookie: str) -> tuple[ReplicaAnswer, bytes | None, str]:
        try:
            c = await bk.client(bookie)
            body = await asyncio.wait_for(c.read(lid, entry_id), bk.options.read_timeout)
        except Exception as e:
            status = status_of(e)
            if status in (Status.NO_ENTRY, Status.NO_LEDGER):
                return ReplicaAnswer.MISSING, None, f"{bookie}: {status.name}"
            return ReplicaAnswer.ERROR, None, f"{bookie}: {e}"
        corrupt = _corrupt(bk, md, password, bookie, entry_id, body)
        if corrupt is not None:
            return ReplicaAnswer.ERROR, None, f"{bookie}: {corrupt}"
        return ReplicaAnswer.FOUND, body, bookie

    tasks = [asyncio.ensure_future(one(b)) for b in replicas]
    answers: list[ReplicaAnswer] = []
    notes: list[str] = []
    try:
        for fut in asyncio.as_completed(tasks):
            answer, body, note = await fut
            answers.append(answer)
            notes.append(note)
            decision = recovery_read_decision(md.write_quorum, md.ack_quorum, answers)
            if decision is RecoveryDecision.EXISTS:
                return decision, body, note
            if decision is not RecoveryDecision.UNDECIDED:
                return decision, None, "; ".join(notes)
    finally:
        for t in tasks:
            t.cancel()
    return RecoveryDecision.FAILED, None, "; ".join(notes)


async def _length_through(bk, md, password: bytes | None, last: int, last_body: bytes | None) -> int | None:
    """The ledger's length through entry `last`: the running length in its header (read it if
    recovery did not); None if no replica answered (the stored length is then kept)."""
    if last < 0:
        return 0
    if last_body is None:
        decision, last_body, note = await _recovery_read(bk, md, password, last)
        if decision is not RecoveryDecision.EXISTS:
            log.warning("recovery of ledger %d: could not read entry %d for the ledger length (%s)",
                        md.ledger_id, last, note, extra={"ledger_id": md.ledger_id, "entry_id": last})
            return None
    return parse_header(last_body).length


async def _stream_stripe(bk, md: LedgerMetadata, password: bytes | None, start: int, last: int,
                         avoid: set[str]) -> dict[int, bytes]:
    """Verified bodies of entries start, start+E, ... <= last (one stripe: the same write set),
    streamed from one replica in a range read; a replica that stops (an entry it lacks, an error,
    a corrupt body) hands over to the next at the entry where it stopped. Ends where every
    replica stopped at the same entry: whether that one exists is for `_recovery_read` to say.
    Replicas that failed with an error (collected in `avoid`) are asked last."""
    replicas = sorted(md.write_set(start), key=lambda b: b in avoid)
    step, lid = md.ensemble_size, md.ledger_id
    out: dict[int, bytes] = {}
    pos, stopped, k = start, 0, 0
    while pos <= last and stopped < len(replicas):
        bookie = replicas[k % len(replicas)]
        k += 1
        moved = False
        try:
            c = await bk.client(bookie)
            async with asyncio.timeout(bk.options.read_timeout), aclosing(c.read_range(lid, pos, last, step)) as rows:
                async for eid, body in rows:
                    if eid != pos or _corrupt(bk, md, password, bookie, eid, body) is not None:
                        break
                    out[eid] = body
                    pos += step
                    moved = True
        except Exception as e:
            if status_of(e) not in (Status.NO_ENTRY, Status.NO_LEDGER):
                avoid.add(bookie)
            log.debug("recovery of ledger %d: %s stopped streaming at entry %d: %s", lid, bookie, pos, e)
        stopped = 1 if moved else stopped + 1
    return out


BATCH_BYTES = 16 << 20  # a recovery batch holds about this many bytes of entries (two are in memory)


def next_batch_size(limit: int, md: LedgerMetadata, previous: list[bytes]) -> int:
    """How many entries recovery reads next: `limit` (the client's `recovery_batch_size`), fewer
    when entries are large, so that a batch holds about BATCH_BYTES. Before any entry was seen,
    one entry per stripe (E): a first look at the entries' size that costs one round trip."""
    if not previous:
        return min(limit, md.ensemble_size)
    average = sum(map(len, previous)) / len(previous)
    return max(1, min(limit, int(BATCH_BYTES // max(average, 1))))


async def _read_batch(bk, md: LedgerMetadata, password: bytes | None, first: int, count: int,
                      avoid: set[str]) -> tuple[list[bytes], RecoveryDecision | None, str]:
    """Recovery reads of entries first .. first+count-1, decided in entry order: the bodies up to
    the first entry that is not found, that entry's decision (None if all were found) and its
    note. The entries are streamed, each stripe from one replica (`_stream_stripe`); an entry no
    stream delivered is asked of its whole write quorum (`_recovery_read`), which is what decides
    "does not exist". An entry after one that does not exist is never taken, even if found."""
    last = first + count - 1
    found: dict[int, bytes] = {}
    stripes = await asyncio.gather(*(_stream_stripe(bk, md, password, s, last, avoid)
                                     for s in range(first, min(first + md.ensemble_size, last + 1))))
    for stripe in stripes:
        found.update(stripe)
    bodies: list[bytes] = []
    for entry in range(first, last + 1):
        body = found.get(entry)
        if body is None:
            decision, body, note = await _recovery_read(bk, md, password, entry)
            if decision is not RecoveryDecision.EXISTS:
                return bodies, decision, note
        bodies.append(body)
    return bodies, None, ""


async def _rewrite_batch(bk, view: LedgerMetadata, mk: bytes, first: int, bodies: list[bytes],
                         failed: Collection[str]) -> list[dict[str, str]]:
    """Recovery-add entries first, first+1, ... to their write sets in `view`, pipelined (the
    bookie clients batch them); returns, per entry, the bookies that did not store it and why.
    Bookies that failed before (`failed`) get the adds too but are not waited for: one that hangs
    delays a recovery by one add_timeout, not one per batch."""
    lid = view.ledger_id
    clients: dict[str, object] = {}
    down: dict[str, str] = {}
    for b in {b for i in range(len(bodies)) for b in view.write_set(first + i)}:
        try:
            clients[b] = await bk.client(b)
        except Exception as e:
            down[b] = str(e)
    adds: dict[asyncio.Future, tuple[int, str]] = {}
    failures: list[dict[str, str]] = [{} for _ in bodies]
    for i, body in enumerate(bodies):
        for b in view.write_set(first + i):
            if b in down:
                failures[i][b] = down[b]
            else:
                adds[clients[b].add_nowait(lid, first + i, body, mk, recovery=True)] = (i, b)
    awaited = [fut for fut, (_, b) in adds.items() if b not in failed]
    if awaited:
        await asyncio.wait(awaited, timeout=bk.options.add_timeout)
    for fut in adds:
        fut.cancel()  # a no-op for the adds that completed
    for fut, (i, b) in adds.items():
        if fut.cancelled():
            failures[i][b] = f"no answer within {bk.options.add_timeout:.0f}s"
        elif fut.exception() is not None:
            if status_of(fut.exception()) is Status.UNAUTHORIZED:
                raise UnauthorizedError(f"bookie {b} refused the master key of ledger {lid}: {fut.exception()}")
            if status_of(fut.exception()) is Status.ACCESS_DENIED:
                raise AccessDeniedError(f"bookie {b} refused a recovery add to ledger {lid}: {fut.exception()}")
            failures[i][b] = str(fut.exception())
    return failures


def first_short(write_quorum: int, ack_quorum: int, failures: list[dict[str, str]]) -> int | None:
    """The index of the first entry of a re-written batch that fewer than Qa bookies stored."""
    return next((i for i, f in enumerate(failures) if write_quorum - len(f) < ack_quorum), None)


def recovery_fragment(view: LedgerMetadata, first_entry: int, failed: Collection[str],
                      writable: Mapping[str, str | None]) -> Fragment:
    """Where recovery re-writes entries from `first_entry` on once bookies of the last fragment
    failed its recovery adds: that fragment's ensemble with every bookie in `failed` replaced by a
    writable bookie outside it and `failed` (the writer's ensemble change rule, `next_ensemble`).
    Raises NotEnoughBookiesError when too few writable bookies are left."""
    ensemble = view.current_ensemble
    replace = [i for i, b in enumerate(ensemble) if b in failed]
    return Fragment(first_entry, next_ensemble(view, replace, writable, exclude=failed))


def _added_fragments(fenced: LedgerMetadata, view: LedgerMetadata) -> list[Fragment]:
    """The fragments recovery added to the fenced metadata (its close stores them)."""
    return [f for f in view.fragments if f not in fenced.fragments]


async def _rewrite(bk, view: LedgerMetadata, mk: bytes, first: int,
                   bodies: list[bytes], failed: set[str]) -> LedgerMetadata:
    """Re-write a batch so that Qa bookies of each entry's write set store it; when some entry
    falls short, its failed bookies are replaced from that entry on (`recovery_fragment`) and
    the rest of the batch is re-written there. Returns the view to write the next batch by;
    `failed` collects every bookie that failed a recovery add."""
    lid = view.ledger_id
    while bodies:
        failures = await _rewrite_batch(bk, view, mk, first, bodies, failed)
        for f in failures:
            failed.update(f)
        short = first_short(view.write_quorum, view.ack_quorum, failures)
        if short is None:
            return view
        entry = first + short
        try:
            fragment = recovery_fragment(view, entry, failed, await bk.writable_bookies())
        except NotEnoughBookiesError as e:
            detail = "; ".join(f"{b}: {r}" for b, r in failures[short].items())
            raise LedgerRecoveryError(
                f"recovery of ledger {lid}: no writable bookie can replace {', '.join(sorted(failed))}, "
                f"so entry {entry} cannot be re-written to {view.ack_quorum} bookies ({e}); the ledger "
                f"stays IN_RECOVERY and opening it again retries (failures: {detail})") from None
        log.info("recovery of ledger %d: re-writing from entry %d on %s (replacing %s)", lid, entry,
                 fragment.bookies, sorted(set(view.current_ensemble) - set(fragment.bookies)),
                 extra={"ledger_id": lid, "entry_id": entry})
        view = with_fragment(view, fragment.first_entry_id, fragment.bookies)
        first, bodies = entry, bodies[short:]
    return view


async def recover(bk, md, password: bytes | None, keyless: bool = False):
    """Fence, recover and close an OPEN or IN_RECOVERY ledger; returns its CLOSED metadata.

    Bookies get the master key of `password`, or with `keyless` (autorecovery, acting with its
    admin role) no key. Password None (keyless only): MAC digests are checked structurally."""
    ledgers = bk.store.ledgers
    lid = md.ledger_id
    if keyless:
        mk = b""
    elif password is None:
        raise UnauthorizedError(f"recovering ledger {lid} needs its password (or keyless recovery, as an admin)")
    else:
        mk = make_master_key(password)

    md = (await ledgers.update(lid, to_recovery, current=md)).metadata
    if md.is_closed:
        return md
    lac = await _fence(bk, md, mk)
    last_fragment_first = md.fragments[-1].first_entry_id
    entry = max(lac, last_fragment_first - 1) + 1  # entries before the last fragment were all acked
    log.info("recovering ledger %d: fenced, LAC %d, reading forward from %d", lid, lac, entry, extra={"ledger_id": lid})
    limit = max(1, bk.options.recovery_batch_size)
    view, failed, avoid = md, set(), set()
    last_body = None
    reading = asyncio.ensure_future(_read_batch(bk, md, password, entry, next_batch_size(limit, md, []), avoid))
    try:
        while True:
            bodies, decision, note = await reading
            if decision is None:  # all found: read the next batch while this one is re-written
                reading = asyncio.ensure_future(_read_batch(bk, md, password, entry + len(bodies),
                                                            next_batch_size(limit, md, bodies), avoid))
            elif decision is not RecoveryDecision.MISSING:
                raise LedgerRecoveryError(f"recovery of ledger {lid}: cannot tell whether entry "
                                          f"{entry + len(bodies)} exists (too few replicas answered: {note})")
            view = await _rewrite(bk, view, mk, entry, bodies, failed)
            if bodies:
                last_body = bodies[-1]
            entry += len(bodies)
            if decision is not None:
                break
    finally:
        reading.cancel()
        reading.add_done_callback(lambda t: t.cancelled() or t.exception())
    last = entry - 1
    length = await _length_through(bk, md, password, last, last_body)
    added = _added_fragments(md, view)
    log.info("recovered ledger %d: last entry %d, length %s%s", lid, last, length,
             f", new fragments {added}" if added else "", extra={"ledger_id": lid})

    result = await ledgers.update(lid, close_recovered(last, length, added), current=md)
    if not result.written and result.metadata.last_entry_id != last:
        log.warning("ledger %d was closed by another recovery at %d (this one found %d)",
                    lid, result.metadata.last_entry_id, last, extra={"ledger_id": lid})
    return result.metadata
