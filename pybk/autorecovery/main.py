"""`pybk autorecovery`: run an auditor candidate and a replication worker against a cluster."""
from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from dataclasses import dataclass, field

from pybk import config, eventloop, logformat
from pybk.config import AUTORECOVERY, Common, option_field
from pybk.eventloop import EventLoop, EventLoopError
from pybk.security.auth import AuthFileError
from pybk.security.server import SecurityConfigError, SecurityOptions, ServerSecurity
from pybk.security.tls import CertificateError

from pybk.recovery.options import RecoveryOptions

log = logging.getLogger("pybk.recovery")


@dataclass(frozen=True)
class AutorecoverySettings:
    """Everything `pybk autorecovery` is configured with, grouped by the component that takes it."""

    common: Common = field(default_factory=Common)
    event_loop: EventLoop = option_field("event_loop")
    metadata_uri: str | None = option_field("metadata_uri", AUTORECOVERY)
    http_port: int = option_field("http_port", AUTORECOVERY)  # 0: no admin HTTP
    http_host: str = option_field("http_host")
    name: str | None = option_field("name")
    no_worker: bool = option_field("no_worker")
    security: SecurityOptions = field(default_factory=SecurityOptions)
    recovery: RecoveryOptions = field(default_factory=RecoveryOptions)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    config.add_options(parser, config.AUTORECOVERY)


async def serve(settings: AutorecoverySettings, security: ServerSecurity) -> None:
    from aiohttp import web
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    from pybk.meta import MetadataStore
    from pybk.security.web import admin_middleware

    from . import http
    from .service import AutoRecovery

    store = await MetadataStore.connect(settings.metadata_uri)
    runner = None
    try:
        address = ""
        app = web.Application(middlewares=[admin_middleware(security.authenticator, security.open_paths)])
        if settings.http_port:
            address = f"{settings.http_host}:{settings.http_port}"
            if security.tls:  # advertised for the auditor's admin API; host:port means http
                address = f"https://{address}"
        recovery = AutoRecovery(store, settings.metadata_uri, settings.recovery, name=settings.name, http=address,
                                worker=not settings.no_worker, security=security.client)
        if settings.http_port:
            http.add_routes(app, store, recovery, security.client)

            async def metrics(request):
                return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})

            async def heartbeat(request):
                return web.Response(text="OK\n")

            async def effective_options(request):
                """Every option by name as the running components hold it (secrets shown as set)."""
                out = config.effective(settings.common, settings, security.options, recovery.options)
                return web.json_response({**out, "event_loop": eventloop.running()})

            app.router.add_get("/metrics", metrics)
            app.router.add_get("/heartbeat", heartbeat)
            app.router.add_get("/api/v1/autorecovery/config", effective_options)
            runner = web.AppRunner(app)
            await runner.setup()
            http_ssl = security.http_ssl()
            await web.TCPSite(runner, settings.http_host, settings.http_port,
                              ssl_context=http_ssl.context if http_ssl else None).start()
            for warning in security.warnings(address):
                log.warning("%s", warning)
        log.info("autorecovery %s running (http %s, event loop %s)", recovery.name, address or "off",
                 eventloop.running())
        await recovery.run()
    finally:
        if runner is not None:
            await runner.cleanup()
        await store.close()


def run(args: argparse.Namespace) -> int:
    settings = config.load(AutorecoverySettings, args, config.AUTORECOVERY)
    if settings is None:
        return 2
    try:
        security = ServerSecurity.from_options(settings.security)
    except (CertificateError, AuthFileError, SecurityConfigError) as exc:
        logformat.fatal(log.name, f"pybk autorecovery: refusing to start: {exc}")
        return 3

    from .service import RecoveryStopped

    async def main() -> None:
        task = asyncio.ensure_future(serve(settings, security))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        try:
            await task
        except asyncio.CancelledError:
            pass

    try:
        eventloop.run(main(), settings.event_loop)
    except EventLoopError as exc:
        logformat.fatal(log.name, f"pybk autorecovery: refusing to start: {exc}")
        return 3
    except RecoveryStopped as exc:  # exit non-zero so that a supervisor starts it again
        logformat.fatal(log.name, f"pybk autorecovery: {exc}")
        return 1
    except Exception as exc:
        from pybk.meta import MetadataError
        if isinstance(exc, MetadataError):
            logformat.fatal(log.name, f"pybk autorecovery: {exc}")
            return 1
        raise
    return 0
