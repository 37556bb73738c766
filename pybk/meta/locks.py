"""Locks on the session lease, ordered by create_revision (the standard etcd recipe).

Each contender puts `<name>/<lease id hex>` on its lease; the holder is the contender with the
smallest create_revision; a waiter watches only the contender just ahead of it (no herd), and
a holder's key vanishes when it releases or its lease expires (killed process), handing the
lock on. The same queue elects leaders (election.py).
"""
from __future__ import annotations

import asyncio
import logging

from aetcd import rpc

from .errors import LockLostError, MetadataError, WatchCompactedError
from .etcd import Etcd, cmp_create, cmp_lease, op_delete, op_put, prefix_end
from .session import Session
from .watch import DELETE, Watch

log = logging.getLogger(__name__)


class Lock:
    """A held lock (or leadership). `lost` is set if the session lease expires while held."""

    def __init__(self, queue: "Queue", name: str, key: bytes, lease: int, revision: int, value: bytes):
        self._queue = queue
        self.name = name
        self.key = key
        self.lease = lease
        self.revision = revision
        self.value = value
        self.lost = asyncio.Event()
        self.released = False

    @property
    def held(self) -> bool:
        return not self.released and not self.lost.is_set()

    def check(self) -> None:
        """Raise LockLostError unless still held (call before acting on the lock's protection)."""
        if not self.held:
            raise LockLostError(f"lock {self.name!r} is no longer held"
                                + (" (session lease lost)" if self.lost.is_set() else ""))

    async def release(self) -> None:
        """Give the lock up (its next waiter takes it)."""
        if self.released:
            return
        self.released = True
        self._queue._forget(self)
        if not self.lost.is_set():
            await self._queue.etcd.txn([cmp_lease(self.key, self.lease)], [op_delete(self.key)],
                                       what=f"release {self.name}")

    async def resign(self) -> None:
        """Leadership's name for release: the next candidate leads."""
        await self.release()

    async def __aenter__(self) -> "Lock":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.release()


class Queue:
    """Contenders for names under one directory, on one session."""

    def __init__(self, etcd: Etcd, dir_: bytes, session: Session):
        self.etcd = etcd
        self.dir = dir_
        self.session = session
        self._held: dict[str, Lock] = {}
        self._local: dict[str, asyncio.Lock] = {}
        session.on_lost(self._lease_lost)

    def _lease_lost(self, lease: int) -> None:
        for name, lock in list(self._held.items()):
            if lock.lease == lease:
                lock.lost.set()
                self._held.pop(name, None)

    def _forget(self, lock: Lock) -> None:
        if self._held.get(lock.name) is lock:
            del self._held[lock.name]

    def _pfx(self, name: str) -> bytes:
        if not name or name.startswith("/") or name.endswith("/"):
            raise MetadataError(f"bad lock name {name!r}")
        return self.dir + name.encode() + b"/"

    async def holder(self, name: str) -> tuple[bytes, int] | None:
        """(value, lease) of the current holder, or None."""
        pfx = self._pfx(name)
        resp = await self.etcd.range(pfx, prefix_end(pfx), limit=1, sort_target=rpc.RangeRequest.CREATE,
                                     sort_order=rpc.RangeRequest.ASCEND)
        return (resp.kvs[0].value, resp.kvs[0].lease) if resp.kvs else None

    async def acquire(self, name: str, value: bytes = b"", wait: bool = True,
                      timeout: float | None = None) -> Lock | None:
        """Take the lock; with wait, block until it is ours (or timeout: asyncio.TimeoutError),
        else return None at once when another holds it. One holder per name per process too."""
        local = self._local.setdefault(name, asyncio.Lock())
        if not wait and (local.locked() or name in self._held):
            return None
        if timeout is not None:
            return await asyncio.wait_for(self._acquire_locked(name, value, wait, local), timeout)
        return await self._acquire_locked(name, value, wait, local)

    async def _acquire_locked(self, name: str, value: bytes, wait: bool, local: asyncio.Lock) -> Lock | None:
        async with local:
            while name in self._held:
                if not wait:
                    return None
                lock = self._held[name]
                await _first(lock.lost.wait(), self._released(lock))
            return await self._contend(name, value, wait)

    async def _released(self, lock: Lock) -> None:
        while lock.held:
            await asyncio.sleep(0.1)

    async def _contend(self, name: str, value: bytes, wait: bool) -> Lock | None:
        pfx = self._pfx(name)
        lease = await self.session.lease_id()
        key = pfx + b"%x" % lease
        resp = await self.etcd.txn([cmp_create(key, 0)], [op_put(key, value, lease)],
                                   [rpc.RequestOp(request_range=rpc.RangeRequest(key=key))],
                                   what=f"contend for {name}")
        my_rev = resp.header.revision if resp.succeeded else resp.responses[0].response_range.kvs[0].create_revision
        lock = Lock(self, name, key, lease, my_rev, value)
        try:
            while True:
                ahead = await self.etcd.range(pfx, prefix_end(pfx), limit=1, max_create_revision=my_rev - 1,
                                              sort_target=rpc.RangeRequest.CREATE,
                                              sort_order=rpc.RangeRequest.DESCEND)
                if not ahead.kvs:
                    break
                if not wait:
                    await self.etcd.txn([cmp_lease(key, lease)], [op_delete(key)], what=f"withdraw from {name}")
                    return None
                if self.session.current != lease:
                    raise LockLostError(f"session lease lost while waiting for {name!r}")
                await self._wait_deleted(ahead.kvs[0].key, ahead.header.revision + 1, lease)
        except BaseException:
            if lock.lease == self.session.current:
                try:
                    await asyncio.shield(self.etcd.txn([cmp_lease(key, lease)], [op_delete(key)],
                                                       what=f"withdraw from {name}"))
                except (MetadataError, asyncio.CancelledError):
                    pass
            raise
        if self.session.current != lease:
            raise LockLostError(f"session lease lost while acquiring {name!r}")
        self._held[name] = lock
        return lock

    async def _wait_deleted(self, key: bytes, from_revision: int, lease: int) -> None:
        """Return once key is deleted, or once the watch lost its history to compaction (the
        caller then looks again at who is ahead)."""
        async with Watch(self.etcd, key, start_revision=from_revision) as watch:
            lost = asyncio.ensure_future(self.session.lost.wait())
            try:
                while True:
                    nxt = asyncio.ensure_future(watch.__anext__())
                    done, _ = await asyncio.wait({nxt, lost}, return_when=asyncio.FIRST_COMPLETED)
                    if lost in done:
                        nxt.cancel()
                        raise LockLostError("session lease lost while waiting")
                    try:
                        if nxt.result().type == DELETE:
                            return
                    except WatchCompactedError:
                        return
            finally:
                lost.cancel()


async def _first(*aws) -> None:
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()


class Locks(Queue):
    """`store.locks`: e.g. `lock = await store.locks.acquire(f"underreplicated/{ledger_id}", wait=False)`."""

    def underreplicated_name(self, ledger_id: int) -> str:
        """The lock name a replication worker takes before re-replicating a ledger."""
        return f"underreplicated/{ledger_id}"

    async def try_acquire(self, name: str, value: bytes = b"") -> Lock | None:
        """The lock if free right now, else None."""
        return await self.acquire(name, value, wait=False)
