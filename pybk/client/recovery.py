"""Fencing and recovery of an open ledger (docs/protocol.md), as a reader that takes over:

1. CAS the metadata to IN_RECOVERY (the old writer's next ensemble change or close fails);
2. fence every bookie of the last fragment until each write quorum has Qw - Qa + 1 answers
   (the old writer can then get no add acked); take the max LAC they report;
3. read forward from LAC + 1 one entry at a time; an entry found anywhere is re-written to
   its whole write quorum with the recovery flag; stop at the first entry that Qw - Qa + 1
   replicas lack;
4. CAS CLOSED at the last entry found. Concurrent recoveries converge: each step is a CAS or
   idempotent, and a recovery that loses the final CAS adopts the winner's closed metadata.

Autorecovery may not know the password: it fences and re-writes with the master key stored in
the metadata, and, lacking the password, checks MAC entries structurally only (CRC32C is always
verified; entries are copied verbatim, so readers still verify the MAC).
"""
from __future__ import annotations

import asyncio
import logging

from pybk.bookie.client import Status
from pybk.entry import DigestMismatch, DigestType, decode, parse_header
from pybk.entry import master_key as make_master_key
from pybk.meta.ledgers import Change, LedgerMetadata, LedgerState, Unchanged

from .errors import LedgerRecoveryError, UnauthorizedError, status_of
from .quorum import RecoveryDecision, ReplicaAnswer, fencing_complete, recovery_read_decision

log = logging.getLogger("pybk.client")


def to_recovery(md: LedgerMetadata) -> LedgerMetadata | Unchanged[LedgerState]:
    """Step 1 as a metadata change: an OPEN ledger goes IN_RECOVERY; one already IN_RECOVERY
    (another recovery started) or CLOSED stays as it is."""
    if md.state is LedgerState.OPEN:
        return md.replace(state=LedgerState.IN_RECOVERY)
    return Unchanged(md.state)


def close_recovered(last_entry: int, length: int | None) -> Change[LedgerState]:
    """Step 4 as a metadata change: CLOSED at `last_entry` with `length` (None: keep the stored
    length); a ledger another recovery closed first stays as it is."""
    def change(md: LedgerMetadata) -> LedgerMetadata | Unchanged[LedgerState]:
        if md.is_closed:
            return Unchanged(md.state)
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
        try:
            decode(body, md.digest_type, password or b"", ledger_id=lid, entry_id=entry_id,
                   verify_digest=password is not None or md.digest_type is DigestType.CRC32C)
        except DigestMismatch as e:
            bk.digest_mismatches += 1
            log.warning("recovery of ledger %d: corrupt replica of entry %d on %s: %s", lid, entry_id, bookie, e)
            return ReplicaAnswer.ERROR, None, f"{bookie}: {e}"
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
                        md.ledger_id, last, note)
            return None
    return parse_header(last_body).length


async def _rewrite(bk, md, mk: bytes, entry_id: int, body: bytes) -> None:
    """Recovery-add the entry to its whole write quorum; at least Qa must store it."""
    replicas = md.write_set(entry_id)

    async def one(bookie: str) -> None:
        c = await bk.client(bookie)
        await asyncio.wait_for(c.add(md.ledger_id, entry_id, body, master_key=mk, recovery=True),
                               bk.options.add_timeout)

    results = await asyncio.gather(*(one(b) for b in replicas), return_exceptions=True)
    ok = sum(1 for r in results if not isinstance(r, BaseException))
    if ok < md.ack_quorum:
        detail = "; ".join(f"{b}: {r}" for b, r in zip(replicas, results) if isinstance(r, BaseException))
        raise LedgerRecoveryError(f"recovery of ledger {md.ledger_id}: entry {entry_id} re-written to only "
                                  f"{ok} of {len(replicas)} bookies, needs {md.ack_quorum} ({detail})")


async def recover(bk, md, password: bytes | None, master_key: bytes | None = None):
    """Fence, recover and close an OPEN or IN_RECOVERY ledger; returns its CLOSED metadata.

    With password None (autorecovery without it), bookies get `master_key` (default: the one
    stored in md) and MAC digests are not verified; UnauthorizedError if no key is stored."""
    ledgers = bk.store.ledgers
    lid = md.ledger_id
    mk = master_key
    if mk is None:
        mk = make_master_key(password) if password is not None else md.master_key
    if not mk:
        raise UnauthorizedError(f"ledger {lid} stores no master key: recovering it needs its password")

    md = (await ledgers.update(lid, to_recovery, current=md)).metadata
    if md.is_closed:
        return md
    lac = await _fence(bk, md, mk)
    last_fragment_first = md.fragments[-1].first_entry_id
    entry = max(lac, last_fragment_first - 1) + 1  # entries before the last fragment were all acked
    log.info("recovering ledger %d: fenced, LAC %d, reading forward from %d", lid, lac, entry)
    last_body = None
    while True:
        decision, body, note = await _recovery_read(bk, md, password, entry)
        if decision is RecoveryDecision.MISSING:
            break
        if decision is not RecoveryDecision.EXISTS:
            raise LedgerRecoveryError(f"recovery of ledger {lid}: cannot tell whether entry {entry} exists "
                                      f"(too few replicas answered: {note})")
        await _rewrite(bk, md, mk, entry, body)
        last_body = body
        entry += 1
    last = entry - 1
    length = await _length_through(bk, md, password, last, last_body)
    log.info("recovered ledger %d: last entry %d, length %s", lid, last, length)

    result = await ledgers.update(lid, close_recovered(last, length), current=md)
    if not result.written and result.metadata.last_entry_id != last:
        log.warning("ledger %d was closed by another recovery at %d (this one found %d)",
                    lid, result.metadata.last_entry_id, last)
    return result.metadata
