"""`pybk autorecovery`: run an auditor candidate and a replication worker against a cluster."""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal

from .options import RecoveryOptions


def _env(name: str, default=None):
    return os.environ.get(f"PYBK_{name}", default)


def add_options(parser: argparse.ArgumentParser) -> None:
    """The autorecovery tuning options (shared with `pybk bookie --autorecovery`)."""
    d = RecoveryOptions()
    g = parser.add_argument_group("autorecovery")
    g.add_argument("--lost-bookie-delay", type=float, default=float(_env("LOST_BOOKIE_DELAY", d.lost_bookie_delay)),
                   help="seconds a bookie must be gone from the registry before its ledgers are marked "
                        f"under-replicated (env PYBK_LOST_BOOKIE_DELAY; default {d.lost_bookie_delay:.0f})")
    g.add_argument("--audit-interval", type=float, default=float(_env("AUDIT_INTERVAL", d.audit_interval)),
                   help="seconds between periodic full checks (every ledger's entries on every bookie via "
                        f"ListEntries); 0 disables (env PYBK_AUDIT_INTERVAL; default {d.audit_interval:.0f})")
    g.add_argument("--open-ledger-grace", type=float,
                   default=float(_env("OPEN_LEDGER_GRACE", d.open_ledger_grace)),
                   help="seconds to leave an open ledger's last fragment to its writer before fencing and "
                        f"recovering the ledger (env PYBK_OPEN_LEDGER_GRACE; default {d.open_ledger_grace:.0f})")
    g.add_argument("--ledger-password", action="append", default=None, metavar="PASSWORD",
                   help="a ledger password autorecovery may use. Not needed to re-replicate and fence: "
                        "ledger metadata stores the master key bookies check. Needed to verify MAC digests "
                        "while copying (else only length and ids are checked) and for ledgers created before "
                        "the key was stored. The metadata's password hash picks the right one. Repeatable; "
                        "the empty password is always tried (env PYBK_LEDGER_PASSWORDS, comma-separated)")
    g.add_argument("--replication-batch", type=int, default=int(_env("REPLICATION_BATCH", d.batch_entries)),
                   help=f"entries per read/add batch when copying (default {d.batch_entries})")
    g.add_argument("--parallel-ledgers", type=int, default=int(_env("RECOVERY_PARALLEL_LEDGERS", d.parallel_ledgers)),
                   help=f"ledgers one worker replicates at once (default {d.parallel_ledgers})")
    g.add_argument("--parallel-runs", type=int, default=int(_env("RECOVERY_PARALLEL_RUNS", d.parallel_runs)),
                   help=f"copy runs (read_range streams) in flight per fragment (default {d.parallel_runs})")
    g.add_argument("--poll-interval", type=float, default=float(_env("RECOVERY_POLL_INTERVAL", d.poll_interval)),
                   help=f"seconds between looks at the registry and the markers (default {d.poll_interval})")


def options_from_args(args: argparse.Namespace) -> RecoveryOptions:
    passwords = [b""]
    env = _env("LEDGER_PASSWORDS")
    if env:
        passwords += [p.encode() for p in env.split(",")]
    passwords += [p.encode() for p in (args.ledger_password or [])]
    for name in ("lost_bookie_delay", "audit_interval", "open_ledger_grace", "poll_interval"):
        if getattr(args, name) < 0:
            raise SystemExit(f"pybk autorecovery: --{name.replace('_', '-')} must be >= 0")
    for name in ("replication_batch", "parallel_ledgers", "parallel_runs"):
        if getattr(args, name) < 1:
            raise SystemExit(f"pybk autorecovery: --{name.replace('_', '-')} must be >= 1")
    return RecoveryOptions(lost_bookie_delay=args.lost_bookie_delay, audit_interval=args.audit_interval,
                           open_ledger_grace=args.open_ledger_grace, poll_interval=args.poll_interval,
                           batch_entries=args.replication_batch, parallel_ledgers=args.parallel_ledgers,
                           parallel_runs=args.parallel_runs, passwords=tuple(dict.fromkeys(passwords)))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--metadata-uri", default=_env("METADATA_URI"),
                        help="metadata service, e.g. etcd://127.0.0.1:2379/pybk (env PYBK_METADATA_URI)")
    parser.add_argument("--http-port", type=int, default=int(_env("RECOVERY_HTTP_PORT", 0)),
                        help="serve /api/v1/autorecovery/* and /metrics on this port (0: no HTTP; "
                             "env PYBK_RECOVERY_HTTP_PORT)")
    parser.add_argument("--http-host", default=_env("RECOVERY_HTTP_HOST", "127.0.0.1"),
                        help="address to bind the admin HTTP server to (default 127.0.0.1)")
    parser.add_argument("--name", default=_env("RECOVERY_NAME"),
                        help="this process's name in the auditor election (default host:pid)")
    parser.add_argument("--no-worker", action="store_true",
                        help="only campaign for the auditor; do not replicate")
    parser.add_argument("--log-level", default=_env("LOG_LEVEL", "INFO"), help="logging level (default INFO)")
    add_options(parser)


async def serve(args: argparse.Namespace, options: RecoveryOptions) -> None:
    from aiohttp import web
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    from pybk.meta import MetadataStore

    from . import http
    from .service import AutoRecovery

    store = await MetadataStore.connect(args.metadata_uri)
    runner = None
    try:
        address = ""
        app = web.Application()
        if args.http_port:
            address = f"{args.http_host}:{args.http_port}"
        recovery = AutoRecovery(store, args.metadata_uri, options, name=args.name, http=address,
                                worker=not args.no_worker)
        if args.http_port:
            http.add_routes(app, store, recovery)

            async def metrics(request):
                return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})

            async def heartbeat(request):
                return web.Response(text="OK\n")

            app.router.add_get("/metrics", metrics)
            app.router.add_get("/heartbeat", heartbeat)
            runner = web.AppRunner(app)
            await runner.setup()
            await web.TCPSite(runner, args.http_host, args.http_port).start()
        logging.getLogger("pybk.recovery").info("autorecovery %s running (http %s)", recovery.name,
                                                address or "off")
        await recovery.run()
    finally:
        if runner is not None:
            await runner.cleanup()
        await store.close()


def run(args: argparse.Namespace) -> int:
    if not args.metadata_uri:
        print("pybk autorecovery: --metadata-uri (or PYBK_METADATA_URI) is required")
        return 2
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    options = options_from_args(args)

    async def main() -> None:
        task = asyncio.ensure_future(serve(args, options))
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
