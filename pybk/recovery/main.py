"""`pybk autorecovery`: run an auditor candidate and a replication worker against a cluster."""
from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from typing import Any, Mapping

from pybk import config

from .options import RecoveryOptions, from_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    config.add_options(parser, config.AUTORECOVERY)


async def serve(cfg: Mapping[str, Any], options: RecoveryOptions) -> None:
    from aiohttp import web
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    from pybk.meta import MetadataStore

    from . import http
    from .service import AutoRecovery

    store = await MetadataStore.connect(cfg["metadata_uri"])
    runner = None
    try:
        address = ""
        app = web.Application()
        if cfg["http_port"]:
            address = f"{cfg['http_host']}:{cfg['http_port']}"
        recovery = AutoRecovery(store, cfg["metadata_uri"], options, name=cfg["name"], http=address,
                                worker=not cfg["no_worker"])
        if cfg["http_port"]:
            http.add_routes(app, store, recovery)

            async def metrics(request):
                return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})

            async def heartbeat(request):
                return web.Response(text="OK\n")

            app.router.add_get("/metrics", metrics)
            app.router.add_get("/heartbeat", heartbeat)
            runner = web.AppRunner(app)
            await runner.setup()
            await web.TCPSite(runner, cfg["http_host"], cfg["http_port"]).start()
        logging.getLogger("pybk.recovery").info("autorecovery %s running (http %s)", recovery.name,
                                                address or "off")
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

    async def main() -> None:
        task = asyncio.ensure_future(serve(cfg, options))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        try:
            await task
        except asyncio.CancelledError:
            pass

    try:
        asyncio.run(main())
    except Exception as exc:
        from pybk.meta import MetadataError
        if isinstance(exc, MetadataError):
            print(f"pybk autorecovery: {exc}")
            return 1
        raise
    return 0
