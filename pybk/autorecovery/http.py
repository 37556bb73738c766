"""Admin HTTP routes of autorecovery (`/api/v1/autorecovery/...`), for its own server or a bookie's.

    GET  /api/v1/autorecovery/status                        this process: auditor?, markers, last audit
    GET  /api/v1/autorecovery/list_under_replicated_ledger  markers (ledger, missing bookies, since)
    GET  /api/v1/autorecovery/who_is_auditor                the elected auditor
    PUT  /api/v1/autorecovery/trigger_audit                 run the periodic check now (POST too)
    POST /api/v1/autorecovery/decommission                  {"bookie_id": ...}: start draining
    GET  /api/v1/autorecovery/decommission?bookie_id=       a drain's progress
"""
from __future__ import annotations

import json
import logging

from aiohttp import web

from pybk.meta.errors import BadMetadataError
from pybk.meta.registry import check_bookie_id

from pybk.recovery import admin, decommission

log = logging.getLogger("pybk.recovery.http")  # the name logs and dashboards know

PREFIX = "/api/v1/autorecovery"


def _json(data, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(data, indent=2, default=str), status=status, content_type="application/json")


def _error(status: int, message: str) -> web.Response:
    return _json({"error": message}, status)


def add_routes(app: web.Application, store, recovery=None, security=None) -> None:
    """Mount the routes on an aiohttp app. `recovery` is this process's AutoRecovery, if any;
    `security` (a ClientSecurity) is what this process presents when it calls other admin APIs
    (the auditor's, a bookie's). Who may call these routes is the app's middleware's business."""

    async def status(request: web.Request) -> web.Response:
        if recovery is not None:
            return _json(await recovery.status())
        return _json({"under_replicated": len(await admin.list_under_replicated(store)),
                      "auditor": await admin.who_is_auditor(store)})

    async def list_under_replicated(request: web.Request) -> web.Response:
        return _json(await admin.list_under_replicated(store))

    async def who_is_auditor(request: web.Request) -> web.Response:
        who = await admin.who_is_auditor(store)
        if who is None:
            return _error(404, "no auditor is elected (is any `pybk autorecovery` running?)")
        return _json(who)

    async def trigger_audit(request: web.Request) -> web.Response:
        if recovery is not None and recovery.is_auditor:
            recovery.auditor.trigger()
            return _json({"triggered": True, "auditor": recovery.name})
        if request.query.get("forwarded"):
            return _error(503, "this process is no longer the auditor; ask again")
        try:
            return _json(await admin.trigger_audit(store, security=security))
        except admin.AdminError as exc:
            return _error(503, str(exc))

    async def start_decommission(request: web.Request) -> web.Response:
        try:
            body = await request.json() if request.can_read_body else {}
        except (json.JSONDecodeError, UnicodeDecodeError):
            body = None
        if not isinstance(body, dict):
            return _error(400, "body must be a JSON object like {\"bookie_id\": \"host:port\"}")
        bookie_id = body.get("bookie_id") or request.query.get("bookie_id")
        if not bookie_id or not isinstance(bookie_id, str):
            return _error(400, "missing bookie_id (JSON body {\"bookie_id\": ...} or ?bookie_id=)")
        try:
            check_bookie_id(bookie_id)
            return _json(await decommission.start(store, bookie_id, security), 202)
        except (decommission.DecommissionError, BadMetadataError) as exc:
            return _error(400, str(exc))

    async def decommission_status(request: web.Request) -> web.Response:
        bookie_id = request.query.get("bookie_id")
        if not bookie_id:
            return _json(await admin.decommissions(store))
        state = await decommission.status(store, bookie_id)
        if state is None:
            return _error(404, f"no decommission of {bookie_id} is recorded")
        return _json(state)

    app.router.add_get(f"{PREFIX}/status", status)
    app.router.add_get(f"{PREFIX}/list_under_replicated_ledger", list_under_replicated)
    app.router.add_get(f"{PREFIX}/who_is_auditor", who_is_auditor)
    app.router.add_put(f"{PREFIX}/trigger_audit", trigger_audit)
    app.router.add_post(f"{PREFIX}/trigger_audit", trigger_audit)
    app.router.add_post(f"{PREFIX}/decommission", start_decommission)
    app.router.add_get(f"{PREFIX}/decommission", decommission_status)
