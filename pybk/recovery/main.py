"""`pybk autorecovery`: run an auditor candidate and a replication worker against a cluster."""
from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from typing import Any, Mapping

from pybk import config, eventloop, logformat
from pybk.eventloop import EventLoopError
from pybk.security.auth import AuthFileError
from pybk.security.server import SecurityConfigError, ServerSecurity
from pybk.security.tls import CertificateError

from .options import RecoveryOptions, from_config

log = logging.getLogger("pybk.recovery")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    config.add_options(parser, config.AUTORECOVERY)


async def serve(cfg: Mapping[str, Any], options: RecoveryOptions, security: ServerSecurity) -> None:
    from aiohttp import web
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    from pybk.meta import MetadataStore
    from pybk.security.web import admin_middleware

    from . import http
    from .service import AutoRecovery

    store = await MetadataStore.connect(cfg["metadata_uri"])
    runner = None
    try:
        address = ""
        app = web.Application(middlewares=[admin_middleware(security.authenticator, security.open_paths)])
        if cfg["http_port"]:
            address = f"{cfg['http_host']}:{cfg['http_port']}"
            if security.tls:  # advertised for the auditor's admin API; host:port means http
                address = f"https://{address}"
        recovery = AutoRecovery(store, cfg["metadata_uri"], options, name=cfg["name"], http=address,
                                worker=not cfg["no_worker"], security=security.client)
        if cfg["http_port"]:
            http.add_routes(app, store, recovery, security.client)

            async def metrics(request):
                return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})

            async def heartbeat(request):
                return web.Response(text="OK\n")

            app.router.add_get("/metrics", metrics)
            app.router.add_get("/heartbeat", heartbeat)
            runner = web.AppRunner(app)
            await runner.setup()
            http_ssl = security.http_ssl()
            await web.TCPSite(runner, cfg["http_host"], cfg["http_port"],
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
    cfg = config.load(args, config.AUTORECOVERY)
    if cfg is None:
        return 2
    options = from_config(cfg)
    try:
        security = ServerSecurity.from_config(cfg)
    except (CertificateError, AuthFileError, SecurityConfigError) as exc:
        logformat.fatal(log.name, f"pybk autorecovery: refusing to start: {exc}")
        return 3

    from .service import RecoveryStopped

    async def main() -> None:
        task = asyncio.ensure_future(serve(cfg, options, security))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        try:
            await task
        except asyncio.CancelledError:
            pass

    try:
        eventloop.run(main(), cfg["event_loop"])
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
