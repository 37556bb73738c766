"""Autorecovery inside another process's admin app: the bookie mounts `/api/v1/autorecovery/*`
always, and with `--autorecovery` also runs an auditor candidate and a replication worker there."""
from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from . import http
from pybk.recovery.options import RecoveryOptions
from .service import AutoRecovery

log = logging.getLogger("pybk.recovery.embedded")  # the name logs and dashboards know


class Embedded:
    """The routes (and, when running, the AutoRecovery task) mounted on an aiohttp app."""

    def __init__(self, recovery: AutoRecovery | None):
        self.recovery = recovery
        self.task: asyncio.Task | None = None

    def start(self) -> None:
        """Start autorecovery (if enabled) once the app serves."""
        if self.recovery is not None and self.task is None:
            self.task = asyncio.ensure_future(self.recovery.run())
            self.task.add_done_callback(_said_why)
            log.info("autorecovery running inside this process as %s", self.recovery.name)

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
            self.task = None


def _said_why(task: asyncio.Task) -> None:
    """Autorecovery inside a bookie stopped by itself (RecoveryStopped): the bookie serves on, so say
    so loudly."""
    if not task.cancelled() and task.exception() is not None:
        log.critical("%s; this process serves on without autorecovery", task.exception())


def mount(app: web.Application, store, metadata_uri: str, name: str, http_address: str,
          options: RecoveryOptions | None = None, security=None) -> Embedded:
    """Add the autorecovery routes to app (before it starts); with options, prepare an AutoRecovery
    on `store` that runs with them. `security` (ClientSecurity) is what it presents to bookies and
    other admin APIs."""
    recovery = None
    if options is not None:
        recovery = AutoRecovery(store, metadata_uri, options, name=name, http=http_address, security=security)
    http.add_routes(app, store, recovery, security)
    return Embedded(recovery)
