"""Which ledgers a read covers and how far each is readable (driver side, planning)."""
from __future__ import annotations

import asyncio
from typing import Any, Sequence

from .options import OptionError, ReadOptions
from .plan import Bounds, candidate_ledgers, select_ledgers
from .runtime import client, is_no_such_ledger

PLAN_CONCURRENCY = 32


async def readable(bk: Any, ledger_id: int, password: bytes) -> tuple[int, bool] | None:
    """(last readable entry, closed) of one ledger; None when it does not exist.

    A closed ledger is readable to its last entry; an open one to the LAC that bookies report.
    Opening without recovery checks the password and never fences the writer.
    """
    try:
        handle = await bk.open_ledger(ledger_id, password=password, recovery=False)
    except Exception as exc:
        if is_no_such_ledger(exc):
            return None
        raise
    md = handle.metadata
    if md.is_closed:
        return int(md.last_entry_id), True
    return int(await handle.read_last_add_confirmed()), False


async def _readable_all(bk: Any, ids: Sequence[int], password: bytes) -> list[tuple[int, bool] | None]:
    gate = asyncio.Semaphore(PLAN_CONCURRENCY)

    async def one(lid: int):
        async with gate:
            return await readable(bk, lid, password)
    return list(await asyncio.gather(*(one(i) for i in ids)))


async def hide_pending(bk: Any, ids: Sequence[int], named: bool) -> list[int]:
    """ids without the ledgers readers may not see yet: those a write job created and has not
    committed (`commit.visible`; each job's record fetched once). A named ledger that is pending
    is an error naming it and its job. Ids that do not exist pass through (the caller reports them)."""
    from pybk.meta.errors import NoSuchLedgerError

    from . import commit
    gate, records = asyncio.Semaphore(PLAN_CONCURRENCY), {}

    async def shown(lid: int) -> bool:
        async with gate:
            try:
                custom = (await bk.store.ledgers.get(lid)).custom
            except NoSuchLedgerError:
                return True
            if not commit.needs_record(custom):
                return True
            job = commit.job_of(custom)
            if job not in records:
                records[job] = asyncio.ensure_future(bk.store.jobs.get(job))
            if commit.visible(lid, custom, await records[job]):
                return True
            if named:
                raise OptionError(f"option ledgers: ledger {lid} is not committed: write job {job} "
                                  "has not committed it (still running, failed, or aborted)")
            return False
    keep = await asyncio.gather(*(shown(i) for i in ids))
    return [i for i, k in zip(ids, keep) if k]


async def _ledger_ids(bk: Any, opts: ReadOptions, bounds: Bounds) -> tuple[list[int], bool]:
    """Ledger ids to consider, and whether they were named explicitly (so must exist)."""
    named = candidate_ledgers(opts.ledgers, bounds)
    if named is not None:
        return named, opts.ledgers.finite
    listed = [lid async for lid in bk.list_ledgers()]
    return select_ledgers(listed, opts.ledgers, bounds), False


async def discover(opts: ReadOptions, bounds: Bounds, strict: bool,
                    closed: dict[int, int] | None = None) -> dict[int, int]:
    """{ledger_id: last readable entry} for the ledgers a query covers.

    strict (batch reads): a ledger named in the options that does not exist is an error.
    closed: last entries of ledgers already known to be closed (they never change, so they are not
    asked again); newly seen closed ledgers are added to it.
    """
    bk = await client(opts.metadata_uri, opts.security)
    ids, named = await _ledger_ids(bk, opts, bounds)
    known = closed if closed is not None else {}
    ask = await hide_pending(bk, [i for i in ids if i not in known], named)
    found = await _readable_all(bk, ask, opts.password)
    missing = [i for i, r in zip(ask, found) if r is None]
    if strict and named and missing:
        raise OptionError(f"option ledgers: unknown ledger(s) {', '.join(map(str, missing))} "
                          f"in {opts.metadata_uri}")
    out = {i: known[i] for i in ids if i in known}
    for lid, r in zip(ask, found):
        if r is not None:
            out[lid] = r[0]
            if r[1] and closed is not None:
                closed[lid] = r[0]
    return out
