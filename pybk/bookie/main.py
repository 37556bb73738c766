"""`pybk bookie`: run a bookie storage server (gRPC data plane + admin HTTP + registration)."""
from __future__ import annotations

import argparse
import asyncio
import gc
import json
import secrets
import logging
import resource
import signal
import socket
import sys
from pathlib import Path
from typing import Any

from aiohttp import web

import pybk
from pybk import config, eventloop, logformat
from pybk.eventloop import EventLoopError
from pybk.client.bookie_client import BookieClient, BookieError
from pybk.meta import BookieInfo
from pybk.security.auth import AuthFileError
from pybk.security.roles import Principal, Role
from pybk.security.server import SecurityConfigError, ServerSecurity
from pybk.security.tls import CertificateError
from pybk.transport.grpc_server import ConnectionLimits

from .bookie import Bookie, DirsInUseError
from .rebuild import rebuild_index
from .cookie import Cookie, CookieMismatchError, check as check_cookies, write_local
from .gc import GarbageCollector
from .http import make_app
from .index import IndexDamagedError
from .keys import KeyGate
from .journal import JournalCorruptError, JournalGapError
from .registration import Registration
from .scrub import Scrubber
from .service import BookieService, make_server
from .settings import BookieSettings, ConnectionOptions, ServerOptions

log = logging.getLogger("pybk.bookie")
PROBE_TIMEOUT = 2.0  # seconds the readiness check waits for this bookie's own Info call
MIN_CONNECTIONS = 16  # gRPC connections the open-files limit must leave room for, or the bookie does not start


class DescriptorError(Exception):
    """The open-files limit leaves too few descriptors for gRPC connections after the reserve."""


def open_files_limit() -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit (connections and the bookie's own
    files share it) and return the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if hard == resource.RLIM_INFINITY:  # Linux allows at most fs.nr_open
        try:
            target = int(Path("/proc/sys/fs/nr_open").read_text())
        except (OSError, ValueError):
            target = 1 << 20
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-files limit from %d to %d: %s", soft, target, exc)
    return soft


def connection_limits(options: ConnectionOptions, open_files: int) -> ConnectionLimits:
    """The gRPC port's connection limits: max_connections lowered to what the open-files limit
    leaves after reserved_descriptors, so that the journal, entry logs, index and checkpoints
    never lack a descriptor however many clients connect. DescriptorError if fewer than
    MIN_CONNECTIONS would be left."""
    room = open_files - options.reserved_descriptors
    if room < MIN_CONNECTIONS:
        raise DescriptorError(
            f"the open-files limit ({open_files}, RLIMIT_NOFILE, already raised to its hard limit) leaves "
            f"{max(room, 0)} descriptors for gRPC connections after reserved_descriptors "
            f"{options.reserved_descriptors}, fewer than {MIN_CONNECTIONS}: raise the limit (ulimit -n, systemd's "
            f"LimitNOFILE, the container runtime's nofile) or lower reserved_descriptors")
    configured = options.max_connections
    return ConnectionLimits(max_connections=min(configured, room) if configured else room,
                            max_connections_per_peer=options.max_connections_per_peer,
                            handshake_timeout=options.handshake_timeout, idle_timeout=options.idle_timeout,
                            keepalive_interval=options.keepalive_interval,
                            keepalive_timeout=options.keepalive_timeout)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    config.add_options(parser, config.BOOKIE)


def run(args: argparse.Namespace) -> int:
    settings = config.load(BookieSettings, args, config.BOOKIE)
    if settings is None:
        return 2
    if settings.rebuild_index:
        return eventloop.run(rebuild(settings.server), settings.event_loop)
    try:
        sys.setswitchinterval(0.0005)  # the journal thread gets the GIL back soon after fdatasync
        return eventloop.run(BookieServer(settings).serve(), settings.event_loop)
    except (EventLoopError, CookieMismatchError, JournalCorruptError, JournalGapError, IndexDamagedError, DirsInUseError,
            CertificateError, AuthFileError, SecurityConfigError, DescriptorError) as exc:
        logformat.fatal(log.name, f"pybk bookie: refusing to start: {exc}")
        return 3
    except OSError as exc:
        logformat.fatal(log.name, f"pybk bookie: {exc}")
        return 1


async def rebuild(server: ServerOptions) -> int:
    """`pybk bookie --rebuild-index`: rebuild the index of a stopped bookie, print a JSON summary.
    Whoever can run it has the bookie's files anyway (it needs their write access); with
    --metadata-uri it only reads ledger metadata (the master keys ledgers of earlier releases
    stored; ledgers created now store none, and their writers' keys are checked again)."""
    keys: dict[int, bytes] = {}
    if server.metadata_uri:
        from pybk.meta import MetadataStore
        store = await MetadataStore.connect(server.metadata_uri)
        try:
            keys = {md.ledger_id: md.master_key async for md in store.ledgers.list_metadata() if md.master_key}
        finally:
            await store.close()
    try:
        summary = await asyncio.to_thread(rebuild_index, server.journal_path, server.ledger_paths, keys)
    except DirsInUseError as exc:
        print(f"pybk bookie: refusing to rebuild the index: {exc}", file=sys.stderr)
        return 3
    except OSError as exc:
        print(f"pybk bookie: rebuilding the index failed: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"event": "index_rebuilt", **summary}), flush=True)
    for problem in summary["damaged"]:
        print(f"pybk bookie: skipped damaged data: {problem}", file=sys.stderr)
    return 0


class BookieServer:
    """Wires storage, gRPC service, admin HTTP and registration together for one process."""

    def __init__(self, settings: BookieSettings):
        self.settings = settings
        self.options = server = settings.server
        self.bookie_id = server.bookie_id or f"{server.host}:{server.port}"
        logformat.set_process_fields(bookie_id=self.bookie_id)
        self.journal_dir = server.journal_path
        self.ledger_dirs = server.ledger_paths
        self.security = ServerSecurity.from_options(settings.security)
        # the readiness probe's calls to this process's own gRPC port (a reader, whatever the auth file says)
        self._probe_token = secrets.token_urlsafe(32)
        self.security.authenticator.add_internal_token(self._probe_token, Principal("readiness probe", Role.READER))
        self.bookie = Bookie(self.journal_dir, self.ledger_dirs, settings.storage)
        self.registration: Registration | None = None
        self.gc: GarbageCollector | None = None
        self.scrubber: Scrubber | None = None
        self.service: BookieService | None = None
        self.connections: ConnectionLimits | None = None
        self.embedded = None  # autorecovery's admin routes and, with --autorecovery, its auditor and worker
        self.serving = False
        self._probe: BookieClient | None = None  # this process's client of its own gRPC port
        self._stop = asyncio.Event()

    @property
    def grpc_endpoint(self) -> str:
        return f"{self.options.host}:{self.options.port}"

    @property
    def http_endpoint(self) -> str:
        return f"{self.security.scheme}://{self.options.host}:{self.options.http_port}"

    def bookie_info(self) -> BookieInfo:
        """What the registration advertises: how to reach this bookie and where it stands."""
        return BookieInfo(bookie_id=self.bookie_id, grpc=self.grpc_endpoint, http=self.http_endpoint,
                          zone=self.options.zone, rack=self.options.rack, version=pybk.__version__)

    def info(self) -> dict[str, Any]:
        free, total = self.bookie.disk_space()
        return {"bookie_id": self.bookie_id, "grpc": self.grpc_endpoint, "http": self.http_endpoint,
                "zone": self.options.zone, "rack": self.options.rack, "version": pybk.__version__
                if hasattr(pybk, "__version__") else "", "journal_dir": str(self.journal_dir),
                "ledger_dirs": [str(d) for d in self.ledger_dirs], "free_bytes": free, "total_bytes": total,
                "ledger_count": len(self.bookie.ledgers), "read_only": self.bookie.read_only}

    def state(self) -> dict[str, Any]:
        s, disk = self.bookie.storage, self.bookie.disk
        return {"running": self.serving, "readOnly": disk.read_only, "readOnlyForced": disk.forced,
                "readOnlyDisk": disk.disk, "journalFailed": disk.journal_failed, "diskUsage": disk.usage,
                "highWaterMark": s.opts.disk.high_water_mark, "lowWaterMark": s.opts.disk.low_water_mark,
                "writeCacheBytes": s.cache.bytes, "writeCacheEntries": s.cache.count,
                "journalRecordsReplayed": s.replayed,
                "registered": self.registration.state() if self.registration else None}

    def effective_options(self) -> dict[str, Any]:
        """Every option by name as the running components hold it (GET /api/v1/bookie/config):
        the storage's and its journal's, the gRPC service's limits, the security, housekeeping and
        autorecovery in use; ledger passwords are shown as set, not their values."""
        storage, settings = self.bookie.storage, self.settings
        parts: list[Any] = [settings.common, self.options, settings.connections, storage.opts,
                            self.security.options, self.gc.options if self.gc else settings.housekeeping]
        if storage.journal is not None:
            parts.append(storage.journal.options)
        if self.service is not None:
            parts.append(self.service.limits)
        recovery = self.embedded.recovery if self.embedded is not None else None
        parts.append(recovery.options if recovery is not None else settings.recovery)
        out = config.effective(*parts)
        if self.scrubber is not None:
            out["scrub_interval"] = self.scrubber.interval
        out.update(event_loop=eventloop.running(), rebuild_index=False, autorecovery=recovery is not None)
        return out

    async def ready(self) -> tuple[bool, str]:
        """Ready = serving adds and reads: storage started, this process's own Info call through its
        gRPC port answered, and registered when there is a metadata store (so a client that looks
        the bookie up finds it). Kubernetes' readiness probe, `pybk local` and the test harness
        wait on this, so nothing is sent to a bookie whose data port does not answer yet."""
        if not self.serving:
            return False, "starting"
        if self.registration and not self.registration.registered:
            return False, f"not registered yet {self.registration.last_error}".strip()
        try:
            if self._probe is None:
                self._probe = BookieClient(self.probe_address, timeout=PROBE_TIMEOUT, security=self.security.client,
                                           token=self._probe_token)
            await self._probe.info()
        except BookieError as exc:
            return False, f"gRPC port {self.grpc_endpoint} does not answer: {exc}"
        return True, "serving"

    @property
    def probe_address(self) -> str:
        """Where this process reaches its own gRPC port (loopback when it listens on every address)."""
        host = self.options.host
        return f"{'127.0.0.1' if host in ('0.0.0.0', '') else '::1' if host == '::' else host}:{self.options.port}"

    async def serve(self) -> int:
        """Run until SIGTERM/SIGINT; returns the exit code."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        # Bind both ports first: a taken port fails the start before any cookie, journal or
        # registration is touched.
        server, settings = self.options, self.settings
        open_files = open_files_limit()
        self.connections = connections = connection_limits(settings.connections, open_files)
        security = self.security
        self.service = service = BookieService(self.bookie, self.bookie_id, server.zone, limits=settings.limits,
                                               authenticator=security.authenticator)
        grpc_server = make_server(service, _listen(server.host, server.port, "gRPC"), security.grpc_ssl(),
                                  connections)
        http_ssl = security.http_ssl()
        try:
            http_sock = _listen(server.host, server.http_port, "HTTP")
        except OSError:
            await grpc_server.stop(None)
            raise
        try:
            for d in [self.journal_dir, *self.ledger_dirs]:
                d.mkdir(parents=True, exist_ok=True)
            if server.metadata_uri:
                self.registration = Registration(
                    self.bookie_info(), server.metadata_uri, server.registration_ttl,
                    lambda: self.bookie.read_only)
                await self.registration.connect()
                try:
                    await self.registration.verify_cookie(self.journal_dir, self.ledger_dirs)
                except BaseException:
                    await self.registration.close()
                    raise
            else:
                expected = Cookie.for_dirs("", self.bookie_id, self.journal_dir, self.ledger_dirs)
                if check_cookies(expected, [self.journal_dir, *self.ledger_dirs]):
                    for d in [self.journal_dir, *self.ledger_dirs]:
                        write_local(d, expected)
            try:
                await self.bookie.start()
                await self._report_journal_loss()
            except BaseException:
                if self.registration:
                    await self.registration.close()
                raise
        except BaseException:
            await grpc_server.stop(None)
            http_sock.close()
            raise
        store = self.registration.store if self.registration else None
        if store is not None:
            service.keys = KeyGate(store.ledgers)  # before serving: every first key is checked
        await grpc_server.start()
        if store is not None:
            self.gc = GarbageCollector(self.bookie, store.ledgers, settings.housekeeping)
        self.scrubber = Scrubber(self.bookie.storage, settings.housekeeping.scrub_interval, self.bookie_id,
                                 store.underreplication if store is not None else None)
        app = make_app(self.bookie, info=self.info, state=self.state, ready=self.ready, gc=self.gc, store=store,
                       effective_options=self.effective_options,
                       scrubber=self.scrubber, authenticator=security.authenticator,
                       open_paths=security.open_paths)
        embedded = None
        if self.registration:
            from pybk.autorecovery.embedded import mount
            self.embedded = embedded = mount(app, self.registration.store, server.metadata_uri, self.bookie_id,
                                             self.http_endpoint,
                                             options=settings.recovery if settings.autorecovery else None,
                                             security=security.client)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.SockSite(runner, http_sock, ssl_context=http_ssl.context if http_ssl else None)
        await site.start()
        self.serving = True
        self.scrubber.start()
        lag_watch = loop.create_task(self.bookie.metrics.watch_loop_lag(), name="loop-lag")
        if self.registration:
            self.bookie.disk.on_change = self.registration.read_only_changed
            self.registration.start()
            self.gc.start()
            embedded.start()
        else:
            self.bookie.disk.on_change = None
        log.info("bookie %s serving gRPC on %s (%s), admin HTTP on %s, event loop %s", self.bookie_id,
                 self.grpc_endpoint, "TLS" if security.tls else "plaintext", self.http_endpoint, eventloop.running())
        for warning in security.warnings(self.grpc_endpoint):
            log.warning("%s", warning)
        log.info("gRPC connections: at most %d (max_connections %d, open-files limit %d less "
                 "reserved_descriptors %d), %s per peer", connections.max_connections,
                 settings.connections.max_connections, open_files, settings.connections.reserved_descriptors,
                 connections.max_connections_per_peer or "any")
        print(logformat.event_line(log.name, "ready", event="ready", bookie_id=self.bookie_id,
                                   grpc=self.grpc_endpoint, http=self.http_endpoint,
                                   event_loop=eventloop.running()), flush=True)
        # what start-up made (modules, options, storage) lives as long as the bookie: out of the
        # collector's sight, so that a full collection, which stops the loop, walks only what came
        # after (4,096 connections held next to it: 200,000 objects, stalls of 0.2-0.5 s)
        gc.collect()
        gc.freeze()
        await self._stop.wait()
        log.info("stopping")
        self.serving = False
        await self.scrubber.close()
        lag_watch.cancel()
        if self.registration:
            await embedded.stop()
            await self.gc.close()
            await self.registration.close()
        await grpc_server.stop(grace=2)
        await runner.cleanup()
        if self._probe is not None:
            await self._probe.close()
        await self.bookie.close()
        return 0


    async def _report_journal_loss(self) -> None:
        """After an accepted journal loss, mark every ledger whose ensembles name this bookie
        under-replicated, naming this bookie: which ledgers had entries in the lost range is
        unknowable, and the replication worker copies back only what this bookie lacks. Until
        that succeeded the loss stays recorded (journal.loss) and is reported at the next start."""
        lost = self.bookie.pending_journal_loss()
        if not lost:
            return
        if not self.registration:
            log.error("journal loss (%s) cannot be reported: no metadata store; re-replicate this bookie's "
                      "ledgers by hand", "; ".join(lost))
            return
        store = self.registration.store
        marked = [md.ledger_id async for md in store.ledgers.list_metadata() if self.bookie_id in md.bookies()]
        for ledger_id in marked:
            await store.underreplication.mark(ledger_id, [self.bookie_id])
        self.bookie.journal_loss_reported()
        log.warning("journal loss reported: %d ledgers marked under-replicated for %s (%s)", len(marked),
                    self.bookie_id, "; ".join(lost))


def _listen(host: str, port: int, what: str) -> socket.socket:
    """A listening TCP socket for the gRPC or admin HTTP server (bound now, served later, so
    that a taken port fails the start before anything is touched)."""
    try:
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        dual = host == "::" and socket.has_dualstack_ipv6()  # "::" takes IPv4 clients too
        sock = socket.create_server(address, family=family, backlog=1024, dualstack_ipv6=dual)
    except OSError as exc:
        raise OSError(f"cannot listen for {what} on {host}:{port}: {exc.strerror or exc}") from None
    sock.setblocking(False)
    return sock

