"""Which ledgers a read covers, with which password, and how far each is readable (driver side).

Every candidate ledger's metadata is read (one etcd range read per page for a listing, one get per
named ledger): `admitted` decides from it whether the ledger belongs to the read, the password is
chosen from the options (`ReadOptions.password_for`, selectors included) and checked against the
metadata's password hash without a bookie call, and a closed ledger's end comes from it too; only
open ledgers ask bookies for their last add confirmed.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from pybk.entry import password_hash

from .errors import PybkSparkError
from .options import OnUnauthorized, OptionError, ReadOptions
from .plan import Bounds, candidate_ledgers, select_ledgers
from .runtime import client, is_no_such_ledger

PLAN_CONCURRENCY = 32
log = logging.getLogger("pybk.spark")


@dataclass
class Discovered:
    """What discovery found: per ledger its last readable entry (-1: none yet) and the password
    that opens it, and the ledgers left out because no given password opens them."""

    readable: dict[int, int] = field(default_factory=dict)
    passwords: dict[int, bytes] = field(default_factory=dict)
    unauthorized: list[int] = field(default_factory=list)


def admitted(opts: ReadOptions, md: Any) -> bool:
    """Whether a ledger found in the cluster belongs to this read, judged by its metadata: the one
    place every found ledger passes (the metadata selectors of option ledgers)."""
    return opts.ledgers.matches(md.custom or {})


LIST_ABOVE = 256   # named ledgers beyond which one listing of their range is cheaper than a read each


async def _named_metadata(bk: Any, ids: list[int]) -> tuple[list[Any], list[int]]:
    """Metadata of these ledgers, and the ids that do not exist. Many ids (a range such as
    1-100000) are listed over their key range instead of read one by one."""
    if len(ids) > LIST_ABOVE:
        wanted = set(ids)
        listed = {md.ledger_id: md async for md in bk.store.ledgers.list_metadata(min(ids), max(ids) + 1)
                  if md.ledger_id in wanted}
        return [listed[i] for i in ids if i in listed], [i for i in ids if i not in listed]
    gate = asyncio.Semaphore(PLAN_CONCURRENCY)

    async def one(lid: int) -> Any:
        async with gate:
            try:
                return await bk.ledger_metadata(lid)
            except Exception as exc:
                if is_no_such_ledger(exc):
                    return None
                raise
    found = await asyncio.gather(*(one(i) for i in ids))
    return [md for md in found if md is not None], [i for i, md in zip(ids, found) if md is None]


async def _candidates(bk: Any, opts: ReadOptions, bounds: Bounds) -> tuple[list[Any], list[int], bool]:
    """Metadata of the ledgers to consider, the named ones that do not exist, and whether the
    ledgers were named explicitly (so must exist)."""
    named = candidate_ledgers(opts.ledgers, bounds)
    if named is not None:
        mds, missing = await _named_metadata(bk, named)
        return mds, missing, opts.ledgers.finite
    end = None if bounds.ledger_hi is None else bounds.ledger_hi + 1
    listed = {md.ledger_id: md async for md in bk.store.ledgers.list_metadata(bounds.ledger_lo, end)}
    return [listed[i] for i in select_ledgers(listed, opts.ledgers, bounds)], [], False


async def _last_readable(bk: Any, md: Any, password: bytes) -> int | None:
    """Last readable entry: a closed ledger's last entry, an open one's LAC as bookies report it
    (opened without recovery, so its writer is never fenced); None when it was deleted meanwhile."""
    if md.is_closed:
        return int(md.last_entry_id)
    try:
        handle = await bk.open_ledger(md.ledger_id, password=password, recovery=False)
        return int(await handle.read_last_add_confirmed())
    except Exception as exc:
        if is_no_such_ledger(exc):
            return None
        raise


async def hide_pending(bk: Any, mds: list[Any], named: bool) -> list[Any]:
    """mds without the ledgers readers may not see yet: those a write job created and has not
    committed (`commit.visible`; each job's record fetched once). A named ledger that is pending
    is an error naming it and its job."""
    from pybk.meta import job_commit as commit
    records: dict[str, Any] = {}
    out = []
    for md in mds:
        custom = md.custom or {}
        if commit.needs_record(custom):
            job = commit.job_of(custom)
            if job not in records:
                records[job] = await bk.store.jobs.get(job)
            if not commit.visible(md.ledger_id, custom, records[job]):
                if named:
                    raise OptionError(f"option ledgers: ledger {md.ledger_id} is not committed: write job "
                                      f"{job} has not committed it (still running, failed, or aborted)")
                continue
        out.append(md)
    return out


MISSING_SHOWN = 10


def missing_message(missing: list[int], uri: str) -> str:
    """The error of named ledgers that do not exist: how many, and the first few (a range over
    sparse ids may miss hundreds of thousands)."""
    shown = ", ".join(map(str, missing[:MISSING_SHOWN]))
    more = f" and {len(missing) - MISSING_SHOWN} more" if len(missing) > MISSING_SHOWN else ""
    return (f"option ledgers: {len(missing)} unknown ledger(s) in {uri}: {shown}{more} (ledgers named by id or "
            "closed range must all exist; an open range such as '10-' or 'all' reads only those that do)")


def unauthorized_error(ids: list[int]) -> PybkSparkError:
    """The error of ledgers no given password opens (onUnauthorized=fail)."""
    shown = ", ".join(map(str, ids[:20])) + (f" and {len(ids) - 20} more" if len(ids) > 20 else "")
    return PybkSparkError(f"wrong password for ledger(s) {shown}: give it with option password or "
                          "passwords (JSON by ledger id or metadata.KEY=VALUE selector), or set "
                          "onUnauthorized=skip to read the other ledgers")


async def discover(opts: ReadOptions, bounds: Bounds, strict: bool) -> Discovered:
    """The ledgers a query covers: readable ends and passwords.

    strict (batch reads): a ledger named in the options that does not exist is an error.
    """
    bk = await client(opts.metadata_uri, opts.security)
    mds, missing, named = await _candidates(bk, opts, bounds)
    if strict and named and missing:
        raise OptionError(missing_message(missing, opts.metadata_uri))
    mds = await hide_pending(bk, mds, named)
    out = Discovered()
    usable = []
    for md in mds:
        if not admitted(opts, md):
            continue
        password = opts.password_for(md.ledger_id, md.custom or {})
        if password_hash(password) != md.password_hash:
            out.unauthorized.append(md.ledger_id)
            continue
        out.passwords[md.ledger_id] = password
        usable.append(md)
    if out.unauthorized:
        if opts.on_unauthorized is OnUnauthorized.FAIL:
            raise unauthorized_error(out.unauthorized)
        log.warning("pybk: skipped %d ledger(s) that the given passwords do not open "
                    "(onUnauthorized=skip): %s", len(out.unauthorized),
                    ", ".join(map(str, out.unauthorized[:20])))
    gate = asyncio.Semaphore(PLAN_CONCURRENCY)

    async def one(md: Any) -> int | None:
        async with gate:
            return await _last_readable(bk, md, out.passwords[md.ledger_id])
    for md, last in zip(usable, await asyncio.gather(*(one(md) for md in usable))):
        if last is None:
            out.passwords.pop(md.ledger_id, None)
        else:
            out.readable[md.ledger_id] = last
    return out
