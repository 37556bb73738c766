"""One etcd lease per process, kept alive from a thread of its own.

The lease is granted on first use (clients that never register anything pay nothing). A
LeaseKeeper thread renews it every TTL/3 over its own (synchronous) gRPC channel, so an event
loop busy with long work never lets the lease expire; the loop only reads how long the lease is
known to live. When keepalives fail for longer than the lease's TTL the session declares the
lease lost: it sets `lost`, tells the on-lost callbacks (locks, leaderships), and as soon as
etcd answers again revokes the old lease (so nothing stays registered under it), grants a new
one, clears `lost` and runs the on-new-lease callbacks (the registry re-registers the bookie
there).
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Awaitable, Callable

import grpc
from aetcd import rpc

from .errors import MetadataError, MetadataUnavailableError, SessionClosedError
from .etcd import Etcd, classify

log = logging.getLogger(__name__)

NewLeaseCallback = Callable[[int], Awaitable[None]]
LostCallback = Callable[[int], None]


CHECK_SECONDS = 0.1  # how often the event loop looks at the keeper's news


class LeaseKeeper(threading.Thread):
    """Renews one lease at a time (`lease`, set by the event loop) every TTL/3 with one-shot
    keepalive calls on a channel of its own. `status` is (lease, monotonic expiry, alive):
    replaced whole, so the loop reads it without a lock; alive is False once etcd says the
    lease is gone."""

    def __init__(self, etcd: Etcd, ttl: int):
        super().__init__(name="pybk-lease-keeper", daemon=True)
        self.etcd = etcd
        self.ttl = ttl
        self.timeout = max(0.2, min(etcd.timeout, ttl / 2))
        self.lease: int | None = None
        self.status: tuple[int | None, float, bool] = (None, 0.0, True)
        self.refused_token: str | None = None  # a token etcd refused a keepalive for (the loop renews it)
        self._generation = etcd.channel_generation
        self._channel = etcd.open_channel(grpc)
        self._stub = rpc.LeaseStub(self._channel)
        self._stopping = threading.Event()

    def track(self, lease: int, expires: float) -> None:
        """Keep `lease` alive from now on; it is known to live until `expires` (monotonic)."""
        self.status = (lease, expires, True)
        self.lease = lease

    def run(self) -> None:
        while not self._stopping.is_set():
            if self._generation != self.etcd.channel_generation:
                self._reopen()
            lease = self.lease
            renewed = lease is None or self._renew(lease)
            self._stopping.wait(max(0.1, self.ttl / 3) if renewed else 0.1)

    def _reopen(self) -> None:
        """A new channel, since the connection's TLS files changed (Etcd.reload_tls)."""
        self._generation = self.etcd.channel_generation
        old, self._channel = self._channel, self.etcd.open_channel(grpc)
        self._stub = rpc.LeaseStub(self._channel)
        old.close()

    def _renew(self, lease: int) -> bool:
        """One keepalive; False if etcd did not answer (the caller retries soon)."""
        sent = time.monotonic()
        token = self.etcd.token
        try:
            answers = self._stub.LeaseKeepAlive(iter([rpc.LeaseKeepAliveRequest(ID=lease)]), timeout=self.timeout,
                                                wait_for_ready=True, metadata=self.etcd.call_metadata(token))
            resp = next(answers)
            answers.cancel()
        except (grpc.RpcError, StopIteration) as exc:
            log.debug("keepalive of lease %x: %r", lease, exc)
            details = exc.details() if hasattr(exc, "details") else None
            if token and classify(details).resend_after_authenticating:
                self.refused_token = token
            return False
        current, expires, _ = self.status
        if current == lease:
            self.status = (lease, max(expires, sent + resp.TTL), True) if resp.TTL > 0 else (lease, expires, False)
        return True

    def stop(self) -> None:
        self._stopping.set()
        self.lease = None
        if self.is_alive():
            self.join(self.timeout + 1)
        self._channel.close()


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
        self._keeper: LeaseKeeper | None = None

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
        if self._keeper is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._keeper.stop)
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
        if self._keeper is not None:
            self._keeper.lease = None
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
        if self._keeper is None:
            self._keeper = LeaseKeeper(self.etcd, self.ttl)
            self._keeper.start()
        self._keeper.track(resp.ID, self._expires)
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

    async def _run(self) -> None:
        """Grant a lease when there is none; declare it lost once the keeper has not renewed it
        within its TTL or etcd says it is gone."""
        while not self._closed:
            try:
                if self._lease is None:
                    await self._grant()
                if self._keeper.refused_token is not None:
                    refused, self._keeper.refused_token = self._keeper.refused_token, None
                    await self.etcd.authenticate(stale=refused, refresh=True)
                lease, expires, alive = self._keeper.status
                if lease == self._lease and (not alive or time.monotonic() >= expires):
                    self._declare_lost()
                    continue
                await asyncio.sleep(CHECK_SECONDS)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if isinstance(exc, (grpc.aio.AioRpcError, MetadataError, ConnectionError, asyncio.TimeoutError)):
                    log.debug("lease grant: %r", exc)
                else:
                    log.exception("session task error")
                await asyncio.sleep(0.2)
