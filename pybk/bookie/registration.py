"""The bookie's presence in the metadata store: cookie check and registration under writable/ or
readonly/ on the session lease.

Registration runs in the background and never stops the bookie: while etcd is unreachable the
bookie keeps serving the ledgers it holds and retries; the session re-registers on a new lease.
"""
from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pybk
from pybk.meta import BookieInfo, CookieMismatchError as MetaCookieMismatch, MetadataStore
from pybk.meta.cookies import Cookie as MetaCookie

from .cookie import CookieMismatchError

if TYPE_CHECKING:
    from .main import BookieServer

log = logging.getLogger("pybk.bookie.registration")

RETRY_SECONDS = 1.0


class Registration:
    """Connects to the metadata store, checks cookies, keeps the registration in step with the
    bookie's read-only state."""

    def __init__(self, server: "BookieServer"):
        self.server = server
        self.store: MetadataStore | None = None
        self.registered: str | None = None  # "writable" | "readonly" | None
        self.last_error = ""
        self._changed = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._gc_task: asyncio.Task | None = None
        self.last_gc: dict | None = None

    async def connect(self, timeout: float = 60.0) -> MetadataStore:
        """Open the store, retrying while etcd does not answer (start-up needs the cookie check)."""
        uri = self.server.cfg["metadata_uri"]
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            try:
                self.store = await MetadataStore.connect(uri, lease_ttl=self.server.cfg["registration_ttl"])
                return self.store
            except Exception as exc:  # noqa: BLE001 - report after the deadline
                if asyncio.get_running_loop().time() >= deadline:
                    raise OSError(f"metadata store {uri} unreachable for {timeout:.0f}s: {exc}") from exc
                log.warning("metadata store %s unreachable (%s); retrying", uri, exc)
                await asyncio.sleep(RETRY_SECONDS)

    async def verify_cookie(self) -> None:
        """Compare the cookies in etcd and in every dir with this bookie's; write them when new."""
        s = self.server
        instance_id = await self.store.cluster.instance_id()
        expected = MetaCookie(instance_id=instance_id, bookie_id=s.bookie_id,
                              journal_dir=str(s.journal_dir.resolve()),
                              ledger_dirs=tuple(str(Path(d).resolve()) for d in s.ledger_dirs))
        try:
            verdict = await self.store.cookies.verify(expected)
        except MetaCookieMismatch as exc:
            raise CookieMismatchError(
                f"{exc}. To fix: start the bookie with the --bookie-id, --journal-dir and --ledger-dir its "
                f"cookie names (see the COOKIE file in each dir), or give it empty dirs and a new id") from exc
        log.info("cookie check: %s", verdict)

    def info(self) -> BookieInfo:
        s = self.server
        return BookieInfo(bookie_id=s.bookie_id, grpc=s.grpc_endpoint, http=s.http_endpoint,
                          zone=s.cfg["zone"], rack=s.cfg["rack"], version=pybk.__version__)

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._run(), name="registration")
        interval = self.server.cfg["gc_interval"]
        if interval > 0:
            self._gc_task = loop.create_task(self._gc_loop(interval), name="gc")

    def read_only_changed(self, read_only: bool) -> None:
        self._changed.set()

    def state(self) -> dict:
        return {"state": self.registered, "error": self.last_error}

    async def _run(self) -> None:
        registry = self.store.registry
        info = self.info()
        while True:
            self._changed.clear()
            want = self.server.storage.read_only
            want_state = "readonly" if want else "writable"
            if self.registered != want_state:
                try:
                    if self.registered is None:
                        await registry.register(info, readonly=want)
                    else:
                        await registry.set_readonly(info.bookie_id, want)
                    self.registered = want_state
                    self.last_error = ""
                    log.info("registered as %s under %s", info.bookie_id, want_state)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - never let etcd trouble stop the bookie
                    self.last_error = str(exc)
                    log.warning("registration as %s failed (%s); retrying", want_state, exc)
                    await asyncio.sleep(RETRY_SECONDS)
                    continue
            if self.server.storage.read_only != want:
                continue
            await self._changed.wait()

    async def collect_garbage(self) -> dict:
        """Drop the ledgers this bookie holds that no longer exist in the metadata store.

        The bookie's ledger set is taken before listing the metadata: a ledger's metadata is
        created before any of its entries reach a bookie, so every ledger in that set that is
        still alive shows up in the listing."""
        t0 = time.monotonic()
        mine = set(self.server.storage.ledgers)
        live = set()
        async for ledger_id in self.store.ledgers.list():
            live.add(ledger_id)
        dead = mine - live
        dropped = await self.server.storage.delete_ledgers(dead) if dead else 0
        compaction = await self.server.storage.compact()
        self.last_gc = {"deleted_ledgers": sorted(dead), "dropped_entries": dropped, **compaction,
                        "seconds": round(time.monotonic() - t0, 3), "at": time.time()}
        if dead:
            log.info("garbage collection: dropped %d deleted ledgers (%d entries), reclaimed %d bytes",
                     len(dead), dropped, compaction["reclaimed_bytes"])
        return self.last_gc

    async def _gc_loop(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.collect_garbage()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - try again next round
                log.warning("garbage collection failed: %s", exc)

    async def close(self) -> None:
        """Unregister (best effort) and close the store, revoking the lease."""
        for task in (self._task, self._gc_task):
            if task:
                task.cancel()
                try:
                    await task
                except (asyncio.CancelledError, Exception):
                    pass
        if self.store is not None:
            try:
                await asyncio.wait_for(self.store.registry.unregister(self.server.bookie_id), 3)
            except Exception as exc:  # noqa: BLE001
                log.warning("unregister failed: %s", exc)
            try:
                await asyncio.wait_for(self.store.close(), 5)
            except Exception as exc:  # noqa: BLE001
                log.warning("closing the metadata store failed: %s", exc)
