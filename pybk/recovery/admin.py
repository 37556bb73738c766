"""Autorecovery administration used by the shell and the admin API: list markers, find the
auditor, trigger an audit, decommission or recover a bookie."""
from __future__ import annotations

import asyncio
import json
import time
from typing import Callable

import aiohttp

from pybk.security.settings import ClientSecurity
from pybk.security.web import admin_headers, admin_ssl

from . import decommission, plan
from .auditor import ELECTION


class AdminError(Exception):
    """An administrative request could not be done; the message says why."""


async def list_under_replicated(store) -> list[dict]:
    """Every under-replication marker: ledger id, missing bookies, since (unix seconds)."""
    return [{"ledger_id": m.ledger_id, "missing": sorted(m.missing), "since_ms": m.since_ms}
            async for m in store.underreplication.list()]


async def who_is_auditor(store) -> dict | None:
    """The elected auditor's identity ({"id", "http", "pid"}), or None when none is elected."""
    value = await store.election.leader(ELECTION)
    if value is None:
        return None
    try:
        return json.loads(value)
    except ValueError:
        return {"id": value, "http": ""}


async def trigger_audit(store, timeout: float = 10.0, security: ClientSecurity | None = None) -> dict:
    """Ask the elected auditor (through its admin API, with security's CA and token, by default
    from the environment) to run the periodic check now."""
    security = security if security is not None else ClientSecurity.from_env()
    who = await who_is_auditor(store)
    if who is None:
        raise AdminError("no auditor is elected: start `pybk autorecovery` (or a bookie with --autorecovery)")
    if not who.get("http"):
        raise AdminError(f"the auditor {who.get('id')} runs without an admin HTTP port; "
                         "start it with --http-port to trigger audits remotely")
    url = decommission.http_url(who["http"], "/api/v1/autorecovery/trigger_audit?forwarded=1")
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as s:
            async with s.put(url, ssl=admin_ssl(security), headers=admin_headers(security)) as resp:
                body = await resp.text()
                if resp.status >= 400:
                    raise AdminError(f"{url} answered {resp.status}: {body[:200]}")
                return json.loads(body)
    except aiohttp.ClientError as exc:
        raise AdminError(f"cannot reach the auditor at {url}: {exc}") from exc


async def decommissions(store) -> dict:
    """Every recorded drain request and its progress."""
    return {b: rec.to_json() for b, rec in (await store.decommission.list()).items()}


async def decommission_bookie(store, bookie_id: str, wait: bool = True,
                              on_progress: Callable[[plan.DrainProgress], None] | None = None,
                              timeout: float | None = None, security: ClientSecurity | None = None) -> dict:
    """Start draining a bookie (its admin API called with `security`); with wait, return once no
    ledger references it and its cookie is deleted (the elected auditor finishes drains, so one
    must be running)."""
    started = await decommission.start(store, bookie_id, security)
    if not wait:
        return started
    if await who_is_auditor(store) is None:
        raise AdminError("no auditor is elected, so nothing would finish the drain: start `pybk autorecovery` "
                         "(the request is recorded and proceeds once one runs)")
    progress = await decommission.wait(store, bookie_id, on_progress, timeout=timeout)
    return {"bookie": bookie_id, "total": progress.total, "remaining": progress.remaining, "done": progress.done}


async def recover_bookie(store, bookie_id: str, wait: bool = True, timeout: float | None = None,
                         on_progress: Callable[[int, int], None] | None = None) -> dict:
    """Mark every ledger with a fragment on the bookie now (no lost-bookie delay) and, with wait,
    return when the workers have finished them."""
    ledgers = await decommission.referencing_ledgers(store, bookie_id)
    for lid in ledgers:
        await store.underreplication.mark(lid, [bookie_id])
    if not wait:
        return {"bookie": bookie_id, "marked": ledgers}
    deadline = None if timeout is None else time.monotonic() + timeout
    todo = set(ledgers)
    while True:
        marked = {m.ledger_id async for m in store.underreplication.list()}
        left = todo & marked
        if on_progress:
            on_progress(len(todo) - len(left), len(todo))
        if not left:
            return {"bookie": bookie_id, "marked": ledgers, "done": True}
        if deadline is not None and time.monotonic() > deadline:
            raise AdminError(f"{len(left)} of {len(todo)} ledgers of {bookie_id} are still under-replicated "
                             f"after {timeout:.0f}s (is `pybk autorecovery` running?)")
        await asyncio.sleep(1.0)
