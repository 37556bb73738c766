"""The bookie's admin HTTP API (aiohttp) and Prometheus metrics endpoint."""
from __future__ import annotations

import asyncio
import bisect
import json
from typing import Any, Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from pybk.meta import MetadataError, MetadataStore, NoSuchLedgerError
from pybk.security.auth import Authenticator
from pybk.security.web import admin_middleware

from .bookie import Bookie
from .gc import GarbageCollector
from .scrub import Scrubber


LEDGER_PAGE = 1000  # ledgers per /api/v1/ledger/list page unless ?limit= says otherwise
MAX_LEDGER_PAGE = 100_000


def _ledger_page(bookie: Bookie, ids: list[int], start: int, limit: int, with_entries: bool) -> bytes:
    """Worker thread: the JSON of one page of the ledger list, from ledger id `start`."""
    ids.sort()
    first = bisect.bisect_left(ids, start)
    page = ids[first:first + limit]
    out = []
    for lid in page:
        st = bookie.ledgers.get(lid)
        if st is None:  # deleted meanwhile
            continue
        item = {"ledger_id": lid, "lac": st.last_add_confirmed, "fenced": st.fenced}
        if with_entries:
            item["entries"] = bookie.list_entries(lid)
        out.append(item)
    more = first + limit < len(ids)
    return json.dumps({"ledgers": out, "next": page[-1] + 1 if more else None}).encode()


def make_app(bookie: Bookie, *, info: Callable[[], dict[str, Any]], state: Callable[[], dict[str, Any]],
             ready: Callable[[], Awaitable[tuple[bool, str]]], gc: GarbageCollector | None,
             store: MetadataStore | None, scrubber: Scrubber | None = None,
             authenticator: Authenticator | None = None, open_paths: tuple[str, ...] = (),
             effective_options: Callable[[], dict[str, Any]] | None = None) -> web.Application:
    """Routes: /heartbeat, /metrics, /api/v1/bookie/{info,state,state/readonly,is_ready,gc,scrub,config},
    /api/v1/ledger/{list,metadata}. With an authenticator, reads need `reader` except the
    `open_paths`, and every state-changing route needs `admin` (pybk.security.web); without one
    anyone who reaches the admin port may call every route.

    info, state and ready describe the whole process; gc and store are None when the bookie runs
    without a metadata store."""
    app = web.Application(middlewares=[admin_middleware(authenticator, open_paths)])

    async def heartbeat(request: web.Request) -> web.Response:
        return web.Response(text="OK\n")

    async def metrics(request: web.Request) -> web.Response:
        # the bookie's own registry, then the process-wide one: etcd errors, the process's CPU and
        # memory, and an embedded autorecovery's pybk_recovery_* (--autorecovery)
        body = generate_latest(bookie.metrics.registry) + generate_latest(REGISTRY)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def get_info(request: web.Request) -> web.Response:
        return web.json_response(info())

    async def get_state(request: web.Request) -> web.Response:
        return web.json_response(state())

    async def get_config(request: web.Request) -> web.Response:
        """Every option by name as the running components hold it (secrets shown as set, not their value)."""
        return web.json_response(effective_options() if effective_options else {})

    async def get_readonly(request: web.Request) -> web.Response:
        return web.json_response({"readOnly": bookie.read_only, "forced": bookie.disk.forced,
                                  "disk": bookie.disk.disk})

    async def put_readonly(request: web.Request) -> web.Response:
        try:
            body = await request.json()
            value = body["readOnly"]
            if not isinstance(value, bool):
                raise TypeError
        except Exception:  # noqa: BLE001 - any malformed body is the client's error
            return web.json_response({"error": 'send JSON {"readOnly": true} or {"readOnly": false}'}, status=400)
        bookie.set_read_only(value)
        return web.json_response({"readOnly": bookie.read_only, "forced": bookie.disk.forced,
                                  "disk": bookie.disk.disk})

    async def get_is_ready(request: web.Request) -> web.Response:
        is_ready, why = await ready()
        return web.json_response({"ready": is_ready, "reason": why}, status=200 if is_ready else 503)

    async def gc_status(request: web.Request) -> web.Response:
        return web.json_response({"last": gc.last if gc else None, "enabled": gc is not None})

    async def gc_run(request: web.Request) -> web.Response:
        if gc is None:
            return web.json_response({"error": "garbage collection needs --metadata-uri"}, status=409)
        try:
            return web.json_response(await gc.collect())
        except Exception as exc:  # noqa: BLE001 - report, do not crash
            return web.json_response({"error": str(exc)}, status=503)

    async def scrub_status(request: web.Request) -> web.Response:
        """The last scrub's result (null before the first run)."""
        last = scrubber.last if scrubber else None
        return web.json_response({"last": last.to_json() if last else None, "enabled": scrubber is not None,
                                  "running": bool(scrubber and scrubber.running),
                                  "interval": scrubber.interval if scrubber else 0})

    async def scrub_run(request: web.Request) -> web.Response:
        """Scrub now (or join the scrub in progress) and answer its result; it may take long on a
        big bookie and goes on if the caller disconnects. Needs `admin` when authentication is on."""
        if scrubber is None:
            return web.json_response({"error": "this bookie has no scrubber"}, status=409)
        try:
            return web.json_response((await scrubber.scrub()).to_json())
        except Exception as exc:  # noqa: BLE001 - report, do not crash
            return web.json_response({"error": f"scrub failed: {exc}"}, status=503)

    async def ledger_list(request: web.Request) -> web.Response:
        """Ledgers this bookie holds with their LAC and fenced flag, one page at a time:
        ?start=<first ledger id>&limit=<page size, default 1000, at most 100000>; `next` in the
        answer is the start of the next page (null after the last). ?entries=true adds each
        ledger's entry ranges. Worked out in a worker thread, so a long listing never stalls the
        event loop. Needs `reader` when authentication is on."""
        try:
            start = int(request.query.get("start", 0))
            limit = int(request.query.get("limit", LEDGER_PAGE))
            if start < 0 or not 0 < limit <= MAX_LEDGER_PAGE:
                raise ValueError
        except ValueError:
            return web.json_response({"error": f"pass ?start=<ledger id >= 0>&limit=<1..{MAX_LEDGER_PAGE}>"},
                                     status=400)
        with_entries = request.query.get("entries", "").lower() in ("1", "true", "yes")
        ids = list(bookie.ledgers)  # a snapshot; the thread must not iterate a dict the loop changes
        body = await asyncio.get_running_loop().run_in_executor(
            None, _ledger_page, bookie, ids, start, limit, with_entries)
        return web.Response(body=body, content_type="application/json")

    async def ledger_metadata(request: web.Request) -> web.Response:
        try:
            ledger_id = int(request.query["ledger_id"])
        except (KeyError, ValueError):
            return web.json_response({"error": "pass ?ledger_id=<integer>"}, status=400)
        if store is None:
            return web.json_response({"error": "no metadata store: the bookie runs without --metadata-uri"},
                                     status=409)
        try:
            md = await store.ledgers.get(ledger_id)
        except NoSuchLedgerError:
            return web.json_response({"error": f"no ledger {ledger_id}"}, status=404)
        except MetadataError as exc:
            return web.json_response({"error": str(exc)}, status=503)
        return web.json_response(md.to_json())

    app.router.add_get("/api/v1/ledger/list", ledger_list)
    app.router.add_get("/api/v1/ledger/metadata", ledger_metadata)
    app.router.add_get("/heartbeat", heartbeat)
    app.router.add_get("/api/v1/bookie/gc", gc_status)
    app.router.add_post("/api/v1/bookie/gc", gc_run)
    app.router.add_put("/api/v1/bookie/gc", gc_run)
    app.router.add_get("/api/v1/bookie/scrub", scrub_status)
    app.router.add_post("/api/v1/bookie/scrub", scrub_run)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/api/v1/bookie/info", get_info)
    app.router.add_get("/api/v1/bookie/state", get_state)
    app.router.add_get("/api/v1/bookie/config", get_config)
    app.router.add_get("/api/v1/bookie/state/readonly", get_readonly)
    app.router.add_put("/api/v1/bookie/state/readonly", put_readonly)
    app.router.add_get("/api/v1/bookie/is_ready", get_is_ready)
    return app
