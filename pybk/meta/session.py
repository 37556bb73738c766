"""One etcd lease per process, kept alive by one long-lived keepalive stream.

The lease is granted on first use (clients that never register anything pay nothing). When
keepalives fail for longer than the lease's TTL the session declares the lease lost: it sets
`lost`, tells the on-lost callbacks (locks, leaderships), and as soon as etcd answers again
revokes the old lease (so nothing stays registered under it), grants a new one, clears `lost`
and runs the on-new-lease callbacks (the registry re-registers the bookie there).
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Callable

import grpc
from aetcd import rpc

from .errors import MetadataError, MetadataUnavailableError, SessionClosedError
from .etcd import Etcd

log = logging.getLogger(__name__)

NewLeaseCallback = Callable[[int], Awaitable[None]]
LostCallback = Callable[[int], None]


class Session:
    """The process's lease: `await lease_id()`, `lost` event, callbacks on loss and on re-grant."""

    def __init__(self, etcd: Etcd, ttl: int):
        self.etcd = etcd
        self.ttl = ttl
        self.lost = asyncio.Event()
        self.generation = 0
        self._lease: int | None = None
        self._stale: list[int] = []
        self._expires = 0.0
        self._ready = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._closed = False
        self._callbacks: asyncio.Task | None = None
        self._on_new: list[NewLeaseCallback] = []
        self._on_lost: list[LostCallback] = []

    @property
    def current(self) -> int | None:
        """The lease id now held, or None when there is none (not started, or lost)."""
        return self._lease

    def on_new_lease(self, callback: NewLeaseCallback) -> None:
        """Run `await callback(lease_id)` every time a lease replaces a lost one."""
        self._on_new.append(callback)

    def remove_on_new_lease(self, callback: NewLeaseCallback) -> None:
        if callback in self._on_new:
            self._on_new.remove(callback)

    def on_lost(self, callback: LostCallback) -> None:
        """Call `callback(lost_lease_id)` when a lease is declared lost (or revoked by close)."""
        self._on_lost.append(callback)

    def remove_on_lost(self, callback: LostCallback) -> None:
        if callback in self._on_lost:
            self._on_lost.remove(callback)

    async def lease_id(self, timeout: float | None = None) -> int:
        """The live lease, granting it (and starting the keepalive task) on first use.

        Waits up to `timeout` (default: the etcd call timeout) while a lost lease is being
        replaced; raises MetadataUnavailableError if none is live by then.
        """
        if self._closed:
            raise SessionClosedError("metadata session is closed")
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="pybk-meta-keepalive")
        if self._lease is not None:
            return self._lease
        try:
            await asyncio.wait_for(self._ready.wait(), timeout or self.etcd.timeout)
        except asyncio.TimeoutError:
            raise MetadataUnavailableError(self.etcd.endpoints, "no live session lease") from None
        if self._lease is None:
            raise SessionClosedError("metadata session is closed")
        return self._lease

    async def close(self) -> None:
        """Stop keeping the lease alive and revoke it, removing everything attached at once."""
        if self._closed:
            return
        self._closed = True
        for task in (self._task, self._callbacks):
            if task is None:
                continue
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            except Exception as exc:
                log.warning("session task ended with %r", exc)
        lease, self._lease = self._lease, None
        self._ready.set()
        if lease is not None:
            self._notify_lost(lease)
            try:
                await self.etcd.revoke(lease)
            except MetadataError as exc:
                log.warning("could not revoke lease %x on close (it expires by itself): %s", lease, exc)

    def _notify_lost(self, lease: int) -> None:
        for cb in list(self._on_lost):
            try:
                cb(lease)
            except Exception:
                log.exception("on-lost callback failed")

    def _declare_lost(self) -> None:
        lease, self._lease = self._lease, None
        self._ready.clear()
        if lease is None:
            return
        log.warning("metadata session lease %x lost (no keepalive answer within its %ds TTL)", lease, self.ttl)
        self._stale.append(lease)
        self.lost.set()
        self._notify_lost(lease)

    async def _grant(self) -> None:
        while self._stale:
            await self.etcd.revoke(self._stale[0])
            self._stale.pop(0)
        sent = time.monotonic()
        resp = await self.etcd.grant(self.ttl)
        self._lease = resp.ID
        self._expires = sent + resp.TTL
        self.generation += 1
        self.lost.clear()
        self._ready.set()
        if self.generation > 1:
            # Off the keepalive task: a slow callback must never delay keepalives.
            self._callbacks = asyncio.create_task(self._run_callbacks(resp.ID), name="pybk-meta-new-lease")

    async def _run_callbacks(self, lease: int) -> None:
        """Run the on-new-lease callbacks until they all succeed or this lease is gone too."""
        log.warning("metadata session has a new lease %x; re-running %d callbacks", lease, len(self._on_new))
        while not self._closed and self._lease == lease:
            try:
                for cb in list(self._on_new):
                    await cb(lease)
                return
            except Exception as exc:
                log.warning("on-new-lease callback failed (%s); retrying", exc)
                await asyncio.sleep(1.0)

    async def _keepalive(self, stream):
        await stream.write(rpc.LeaseKeepAliveRequest(ID=self._lease))
        return await stream.read()

    async def _run(self) -> None:
        stream = None
        while not self._closed:
            try:
                if self._lease is None:
                    await self._grant()
                if stream is None:
                    stream = self.etcd.lease.LeaseKeepAlive(wait_for_ready=True)
                sent = time.monotonic()
                wait = max(0.1, min(self.etcd.timeout, self._expires - sent))
                resp = await asyncio.wait_for(self._keepalive(stream), wait)
                if resp is grpc.aio.EOF:
                    raise ConnectionError("keepalive stream ended")
                if resp.TTL <= 0:
                    self._declare_lost()
                    continue
                self._expires = sent + resp.TTL
                await asyncio.sleep(max(0.2, self.ttl / 3))
            except asyncio.CancelledError:
                if stream is not None:
                    stream.cancel()
                raise
            except Exception as exc:
                expected = (grpc.aio.AioRpcError, MetadataError, ConnectionError, asyncio.TimeoutError,
                            asyncio.InvalidStateError, grpc.aio.UsageError)
                if isinstance(exc, expected):
                    log.debug("keepalive: %r", exc)
                else:
                    log.exception("keepalive task error")
                if stream is not None:
                    stream.cancel()
                    stream = None
                if self._lease is not None and time.monotonic() >= self._expires:
                    self._declare_lost()
                await asyncio.sleep(0.2)
