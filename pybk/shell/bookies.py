"""`pybk shell listbookies`: the registered bookies, optionally with each one's Info answer."""
from __future__ import annotations

import argparse
import asyncio
from typing import Any

from .core import Shell, command
from .format import format_table, human_bytes


def _render_bookies(rows: list[dict[str, Any]], args: Any = None) -> str:
    headers = ["bookie", "state", "grpc", "http", "zone", "rack", "version"]
    with_info = bool(rows) and "info" in rows[0]
    if with_info:
        headers += ["ledgers", "disk free", "disk total"]
    table = []
    for b in rows:
        row = [b["id"], b["state"], b["grpc"], b["http"], b["zone"] or "-", b["rack"] or "-", b["version"] or "-"]
        if with_info:
            info = b["info"]
            row += (["unreachable", "", ""] if "error" in info else
                    [info["ledger_count"], human_bytes(info["free_bytes"]), human_bytes(info["total_bytes"])])
        table.append(row)
    return format_table(headers, table, empty="no bookies registered")


def bookie_json(info: Any, state: str) -> dict[str, Any]:
    return {"id": info.bookie_id, "state": state, "grpc": info.grpc, "http": info.http,
            "zone": info.zone or None, "rack": info.rack or None, "version": info.version or None}


def _listbookies_args(p: argparse.ArgumentParser) -> None:
    which = p.add_mutually_exclusive_group()
    which.add_argument("--readwrite", "-rw", action="store_true", help="only writable bookies")
    which.add_argument("--readonly", "-ro", action="store_true", help="only read-only bookies")
    p.add_argument("-i", "--info", action="store_true",
                   help="also ask each bookie for its ledger count and disk space (gRPC Info)")


@command("listbookies", "list registered bookies (writable and read-only)", _listbookies_args, _render_bookies)
async def listbookies(sh: Shell, args: argparse.Namespace) -> list[dict[str, Any]]:
    store = await sh.store()
    rows = []
    if not args.readonly:
        rows += [bookie_json(i, "writable") for i in (await store.registry.writable()).values()]
    if not args.readwrite:
        rows += [bookie_json(i, "readonly") for i in (await store.registry.readonly()).values()]
    rows.sort(key=lambda b: b["id"])
    if args.info:
        infos = await asyncio.gather(*(_bookie_info(b["grpc"]) for b in rows))
        for b, info in zip(rows, infos):
            b["info"] = info
    return rows


async def _bookie_info(address: str) -> dict[str, Any]:
    """The bookie's Info answer, or {"error": ...} when it does not answer."""
    from pybk.client.bookie_client import BookieClient
    from pybk.security.settings import ClientSecurity
    try:
        c = await asyncio.wait_for(BookieClient.connect(address, security=ClientSecurity.from_env()), 10)
        try:
            return await asyncio.wait_for(c.info(), 10)
        finally:
            await c.close()
    except Exception as e:  # a bookie that does not answer is shown as such, not a failure of the listing
        return {"error": f"{type(e).__name__}: {e}"}

