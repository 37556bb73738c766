"""Prefix watches that survive disconnects and etcd restarts without missing an event.

A Watch remembers the revision after the last event it delivered and, when the stream
breaks, opens a new one starting exactly there, so the consumer sees every change once,
in revision order. Events are read only while the consumer iterates (no background task).
"""
from __future__ import annotations

import asyncio
import collections
import logging
from dataclasses import dataclass
from typing import AsyncIterator

import grpc
from aetcd import rpc

from .errors import MetadataUnavailableError, WatchCompactedError
from .etcd import Etcd, Refusal, classify

log = logging.getLogger(__name__)

PUT = "PUT"
DELETE = "DELETE"


@dataclass(frozen=True)
class WatchEvent:
    """One change: type PUT or DELETE, the key, the new value (b"" on DELETE), its revision."""

    type: str
    key: bytes
    value: bytes
    revision: int
    create_revision: int
    lease: int
    prev_value: bytes | None = None


class _Cancelled(Exception):
    """etcd cancelled the watch; reason is its cancel_reason."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class Watch:
    """`async for event in watch` over [key, range_end) from start_revision (0 = from now)."""

    def __init__(self, etcd: Etcd, key: bytes, range_end: bytes = b"", start_revision: int = 0,
                 prev_kv: bool = False):
        self.etcd = etcd
        self.key = key
        self.range_end = range_end
        self.next_revision = start_revision
        self.prev_kv = prev_kv
        self.reconnects = 0
        self._buffer: collections.deque[WatchEvent] = collections.deque()
        self._call = None
        self._closed = False
        self._token: str | None = None    # the token the stream was opened with
        self._resent = False              # a refused create was already sent again with a fresh token

    def __aiter__(self) -> "Watch":
        return self

    async def __aenter__(self) -> "Watch":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop watching; iteration ends."""
        self._closed = True
        self._drop()

    def _drop(self) -> None:
        if self._call is not None:
            self._call.cancel()
            self._call = None

    async def _open(self) -> None:
        self._token = await self.etcd.authenticate()
        call = self.etcd.watch.Watch(wait_for_ready=True, metadata=self.etcd.call_metadata(self._token))
        try:
            create = rpc.WatchCreateRequest(key=self.key, range_end=self.range_end,
                                            start_revision=self.next_revision, prev_kv=self.prev_kv)
            await call.write(rpc.WatchRequest(create_request=create))
            resp = await call.read()
            self._call = call
            self._take(resp)
        except BaseException:
            call.cancel()
            self._call = None
            raise
        self._resent = False

    async def _refused(self, reason: str) -> None:
        """etcd cancelled the watch (reason: its cancel_reason). etcd 3.5 says "permission denied"
        for a watch whose token it no longer knows (it restarted): with a user, authenticate again
        and let the caller reopen, once; otherwise raise the refusal naming who and what."""
        self._drop()
        refusal = classify(reason)
        if (self.etcd.uri.user and not self._resent
                and (refusal.resend_after_authenticating or refusal == Refusal.PERMISSION_DENIED)):
            self._resent = True
            await self.etcd.authenticate(stale=self._token, refresh=True)
            return
        raise self.etcd.refused(refusal, f"the watch on {self.key.decode(errors='replace')}", reason)

    def _take(self, resp) -> None:
        if resp is grpc.aio.EOF:
            raise ConnectionError("watch stream ended")
        if resp.compact_revision:
            raise WatchCompactedError(resp.compact_revision)
        if resp.canceled:
            raise _Cancelled(resp.cancel_reason)
        if self.next_revision == 0:
            self.next_revision = resp.header.revision + 1
        for ev in resp.events:
            kind = DELETE if ev.type == rpc.Event.DELETE else PUT
            prev = ev.prev_kv.value if ev.HasField("prev_kv") else None
            self._buffer.append(WatchEvent(kind, ev.kv.key, ev.kv.value, ev.kv.mod_revision,
                                           ev.kv.create_revision, ev.kv.lease, prev))
            self.next_revision = max(self.next_revision, ev.kv.mod_revision + 1)

    async def __anext__(self) -> WatchEvent:
        delay = 0.1
        while not self._buffer:
            if self._closed:
                raise StopAsyncIteration
            try:
                if self._call is None:
                    await self._open()
                    continue
                self._take(await self._call.read())
                delay = 0.1
            except _Cancelled as cancelled:
                await self._refused(cancelled.reason)
            except (grpc.aio.AioRpcError, ConnectionError, grpc.aio.UsageError, MetadataUnavailableError) as exc:
                if self._closed:
                    raise StopAsyncIteration from None
                log.info("watch on %s broke (%s); resuming from revision %d",
                         self.key.decode(errors="replace"), exc, self.next_revision)
                self._drop()
                self.reconnects += 1
                await asyncio.sleep(delay)
                delay = min(1.0, delay * 2)
        return self._buffer.popleft()


async def watch_range(etcd: Etcd, key: bytes, range_end: bytes, initial: bool = True
                      ) -> AsyncIterator[WatchEvent]:
    """The keys in [key, range_end) as PUT events (with initial), then every change after that read.

    Unlike a bare Watch this never fails on compaction: when etcd no longer has the history a
    resumed watch needs (it was disconnected across a compaction), it reads the range again and
    yields only the difference from what it had delivered (PUT for new or changed keys, DELETE
    for vanished ones, stamped with that read's revision), then watches on from there."""
    known: dict[bytes, bytes] = {}
    first = True
    while True:
        resp = await etcd.range(key, range_end)
        now = {kv.key: kv for kv in resp.kvs}
        rev = resp.header.revision
        if not first or initial:
            for k in sorted(set(known) - set(now)):
                yield WatchEvent(DELETE, k, b"", rev, 0, 0)
            for k, kv in sorted(now.items()):
                if known.get(k) != kv.value:
                    yield WatchEvent(PUT, k, kv.value, kv.mod_revision, kv.create_revision, kv.lease)
        known = {k: kv.value for k, kv in now.items()}
        first = False
        async with Watch(etcd, key, range_end, start_revision=rev + 1) as watch:
            try:
                async for ev in watch:
                    if ev.type == DELETE:
                        known.pop(ev.key, None)
                    else:
                        known[ev.key] = ev.value
                    yield ev
            except WatchCompactedError as exc:
                log.info("watch on %s lost its history to compaction at revision %d; re-reading",
                         key.decode(errors="replace"), exc.compact_revision)
