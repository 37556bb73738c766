"""Decommission: drain a bookie so that no ledger references it, then forget its cookie.

Steps: make the bookie read-only (its admin API, so it takes no new entries), record
a drain request (`/<prefix>/decommission/<bookie>`; replication workers treat the bookie as one to
replace), mark every ledger referencing it under-replicated, wait until none does, delete its
cookie. The waiting is done by the auditor (`drain_step`, every poll), so a request made with
`--no-wait` still completes; the shell's progress bar only watches.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

import aiohttp

from pybk.meta import VersionConflictError
from pybk.meta.decommission import DONE, DRAINING, FAILED, REQUESTED
from pybk.security.settings import ClientSecurity
from pybk.security.web import admin_headers, admin_ssl

from . import plan

log = logging.getLogger(__name__)


ACTIVE = (REQUESTED, DRAINING)  # requests whose bookie replication workers must drain


class DecommissionError(Exception):
    """A decommission could not start or finish; the message says why."""


class UnknownBookieError(DecommissionError):
    """etcd knows nothing of the bookie (not registered, no cookie, no ledger): nothing to drain."""


def http_url(address: str, path: str) -> str:
    """URL of path on an admin endpoint advertised as host:port or http(s)://host:port."""
    base = address if "://" in address else f"http://{address}"
    return base.rstrip("/") + path


async def set_readonly(http_address: str, timeout: float = 10.0, security: ClientSecurity | None = None) -> None:
    """Ask a bookie's admin API to turn read-only (it then rejects adds with READ_ONLY); with
    security's CA and token (default: from the environment), as the endpoint needs `admin`."""
    security = security if security is not None else ClientSecurity.from_env()
    url = http_url(http_address, "/api/v1/bookie/state/readonly")
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as s:
            async with s.put(url, json={"readOnly": True}, ssl=admin_ssl(security),
                             headers=admin_headers(security)) as resp:
                if resp.status >= 400:
                    raise DecommissionError(f"{url} answered {resp.status}: {(await resp.text())[:200]}")
    except aiohttp.ClientError as exc:
        raise DecommissionError(f"cannot reach the bookie's admin API at {url}: {exc}") from exc


async def referencing_ledgers(store, bookie_id: str) -> list[int]:
    """Ids of the ledgers with a fragment naming the bookie."""
    return [md.ledger_id async for md in store.ledgers.list_metadata() if plan.referencing(md.fragments, bookie_id)]


async def start(store, bookie_id: str, security: ClientSecurity | None = None) -> dict:
    """Begin draining a bookie: read-only (its admin API called with `security`), drain request,
    markers. Returns the request's state."""
    state, info = await store.registry.get(bookie_id)
    cookie = await store.cookies.get(bookie_id)
    ledgers = await referencing_ledgers(store, bookie_id)
    if info is None and cookie is None and not ledgers:
        raise UnknownBookieError(f"unknown bookie {bookie_id!r}: not registered, no cookie, no ledger on it")
    largest = 0
    async for md in store.ledgers.list_metadata():
        if plan.referencing(md.fragments, bookie_id):
            largest = max(largest, md.ensemble_size)
    others = set(await store.registry.writable()) - {bookie_id}
    if len(others) < largest:
        raise DecommissionError(f"cannot drain {bookie_id}: a ledger on it has an ensemble of {largest} bookies "
                                f"but only {len(others)} other writable bookies are left to take its place; "
                                "add a bookie first")
    if info is not None and info.http:
        await set_readonly(info.http, security=security)
    elif info is not None:
        log.warning("bookie %s advertises no admin endpoint; draining without making it read-only", bookie_id)
    rec = await store.decommission.request(bookie_id)
    if rec.state in (DONE, FAILED):
        await store.decommission.remove(bookie_id)
        rec = await store.decommission.request(bookie_id)
    if rec.ledgers_total < 0:
        try:
            rec = await store.decommission.update(rec, state=DRAINING, ledgers_total=len(ledgers),
                                                  ledgers_remaining=len(ledgers))
        except VersionConflictError:
            rec = await store.decommission.get(bookie_id) or rec
    for lid in ledgers:
        await store.underreplication.mark(lid, [bookie_id])
    log.info("decommission of %s started: %d ledgers to drain", bookie_id, len(ledgers))
    return rec.to_json()


async def drain_step(store, rec) -> plan.DrainProgress:
    """One look at a drain (run by the auditor): mark what still references the bookie, record
    progress, and when nothing does, delete the cookie and finish the request. Finished and
    failed requests are left alone (the platform or `decommission` again clears them)."""
    bookie_id = rec.bookie_id
    if rec.state not in ACTIVE:
        return plan.drain_progress(max(rec.ledgers_total, 0), max(rec.ledgers_remaining, 0))
    remaining = await referencing_ledgers(store, bookie_id)
    progress = plan.drain_progress(max(rec.ledgers_total, 0), len(remaining))
    marked = {m.ledger_id async for m in store.underreplication.list()}
    for lid in remaining:
        if lid not in marked:
            await store.underreplication.mark(lid, [bookie_id])
    changes: dict = {}
    if progress.done and rec.state != DONE:
        await store.cookies.delete(bookie_id)
        log.info("decommission of %s finished: no ledger references it; cookie deleted", bookie_id)
        changes = {"state": DONE, "message": "drained; cookie deleted"}
    elif not progress.done and rec.state != DRAINING:
        changes = {"state": DRAINING}
    if changes or (rec.ledgers_total, rec.ledgers_remaining) != (progress.total, progress.remaining):
        try:
            await store.decommission.update(rec, ledgers_total=progress.total, ledgers_remaining=progress.remaining,
                                            **changes)
        except VersionConflictError:
            pass
    return progress


async def status(store, bookie_id: str) -> dict | None:
    """The drain request's recorded state, or None."""
    rec = await store.decommission.get(bookie_id)
    return rec.to_json() if rec else None


async def wait(store, bookie_id: str, on_progress: Callable[[plan.DrainProgress], None] | None = None,
               poll: float = 0.5, timeout: float | None = None) -> plan.DrainProgress:
    """Wait until the drain is done (no ledger references the bookie, cookie deleted), reporting
    progress: the shell draws a bar from it."""
    deadline = None if timeout is None else time.monotonic() + timeout
    total = 0
    while True:
        rec = await store.decommission.get(bookie_id)
        remaining = len(await referencing_ledgers(store, bookie_id))
        total = max(total, rec.ledgers_total if rec else 0)
        progress = plan.drain_progress(total, remaining)
        if on_progress:
            on_progress(progress)
        if rec is None:
            if progress.done:
                return progress
            raise DecommissionError(f"the decommission of {bookie_id} was cancelled "
                                    f"({remaining} ledgers still reference it)")
        if rec.state == DONE and progress.done:
            return progress
        if rec.state == FAILED:
            raise DecommissionError(f"decommission of {bookie_id} failed: {rec.message}")
        if deadline is not None and time.monotonic() > deadline:
            raise DecommissionError(f"decommission of {bookie_id} not done after {timeout:.0f}s: "
                                    f"{progress.remaining} ledgers still reference it")
        await asyncio.sleep(poll)
