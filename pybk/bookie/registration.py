"""The bookie's presence in the metadata store: cookie check and registration under writable/ or
readonly/ on the session lease.

Registration runs in the background and never stops the bookie: while etcd is unreachable the
bookie keeps serving the ledgers it holds and retries; the session re-registers on a new lease.
"""
from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Callable

from pybk.meta import BookieInfo, CookieMismatchError as MetaCookieMismatch, MetadataStore
from pybk.meta.cookies import Cookie as MetaCookie
from pybk.meta.registry import registry_state

from .cookie import CookieMismatchError

log = logging.getLogger("pybk.bookie.registration")

RETRY_SECONDS = 1.0


class Registration:
    """Connects to the metadata store, checks cookies, keeps the registration in step with the
    bookie's read-only state (asked of `read_only`, and re-checked on `read_only_changed`)."""

    def __init__(self, info: BookieInfo, uri: str, lease_ttl: int, read_only: Callable[[], bool]):
        self.bookie = info
        self.uri = uri
        self.lease_ttl = lease_ttl
        self.read_only = read_only
        self.store: MetadataStore | None = None
        self.registered_read_only: bool | None = None  # None until registered, then under readonly/ or not
        self.last_error = ""
        self._changed = asyncio.Event()
        self._task: asyncio.Task | None = None

    @property
    def registered(self) -> bool:
        return self.registered_read_only is not None

    async def connect(self, timeout: float = 60.0) -> MetadataStore:
        """Open the store, retrying while etcd does not answer (start-up needs the cookie check)."""
        uri = self.uri
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            try:
                self.store = await MetadataStore.connect(uri, lease_ttl=self.lease_ttl)
                return self.store
            except Exception as exc:  # noqa: BLE001 - report after the deadline
                if asyncio.get_running_loop().time() >= deadline:
                    raise OSError(f"metadata store {uri} unreachable for {timeout:.0f}s: {exc}") from exc
                log.warning("metadata store %s unreachable (%s); retrying", uri, exc)
                await asyncio.sleep(RETRY_SECONDS)

    async def verify_cookie(self, journal_dir: Path, ledger_dirs: list[Path]) -> None:
        """Compare the cookies in etcd and in every dir with this bookie's; write them when new."""
        instance_id = await self.store.cluster.instance_id()
        expected = MetaCookie(instance_id=instance_id, bookie_id=self.bookie.bookie_id,
                              journal_dir=str(journal_dir.resolve()),
                              ledger_dirs=tuple(str(Path(d).resolve()) for d in ledger_dirs))
        try:
            verdict = await self.store.cookies.verify(expected)
        except MetaCookieMismatch as exc:
            raise CookieMismatchError(
                f"{exc}. To fix: start the bookie with the --bookie-id, --journal-dir and --ledger-dir its "
                f"cookie names (see the COOKIE file in each dir), or give it empty dirs and a new id") from exc
        log.info("cookie check: %s", verdict)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="registration")

    def read_only_changed(self, read_only: bool) -> None:
        self._changed.set()

    def state(self) -> dict:
        """For /api/v1/bookie/state: where the bookie is registered (None: not yet), last error."""
        ro = self.registered_read_only
        return {"state": None if ro is None else registry_state(ro), "error": self.last_error}

    async def _run(self) -> None:
        registry = self.store.registry
        info = self.bookie
        while True:
            self._changed.clear()
            want = self.read_only()
            if self.registered_read_only != want:
                try:
                    if self.registered_read_only is None:
                        await registry.register(info, readonly=want)
                    else:
                        await registry.set_readonly(info.bookie_id, want)
                    self.registered_read_only = want
                    self.last_error = ""
                    log.info("registered as %s under %s", info.bookie_id, registry_state(want))
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - never let etcd trouble stop the bookie
                    self.last_error = str(exc)
                    log.warning("registration as %s failed (%s); retrying", registry_state(want), exc)
                    await asyncio.sleep(RETRY_SECONDS)
                    continue
            if self.read_only() != want:
                continue
            await self._changed.wait()

    async def close(self) -> None:
        """Unregister (best effort) and close the store, revoking the lease."""
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self.store is not None:
            try:
                await asyncio.wait_for(self.store.registry.unregister(self.bookie.bookie_id), 3)
            except Exception as exc:  # noqa: BLE001
                log.warning("unregister failed: %s", exc)
            try:
                await asyncio.wait_for(self.store.close(), 5)
            except Exception as exc:  # noqa: BLE001
                log.warning("closing the metadata store failed: %s", exc)
