"""Leader election (the auditor) on the lock queue: the candidate with the smallest
create_revision leads; a killed leader's key vanishes with its lease and the next takes over."""
from __future__ import annotations

from typing import AsyncIterator

from aetcd import rpc

from .etcd import prefix_end
from .locks import Lock, Queue
from .watch import Watch

AUDITOR = "auditor"


class Elections(Queue):
    """`store.election`: `leadership = await store.election.campaign("bookie-1")` blocks until
    leader; `leadership.lost` is set if the lease is lost; `await leadership.resign()`."""

    async def campaign(self, candidate: str, name: str = AUDITOR, timeout: float | None = None) -> Lock:
        """Block until this process leads `name`; the returned Lock's value is the candidate."""
        return await self.acquire(name, candidate.encode(), wait=True, timeout=timeout)

    async def try_lead(self, candidate: str, name: str = AUDITOR) -> Lock | None:
        """Leadership if nobody leads now, else None (without queueing)."""
        return await self.acquire(name, candidate.encode(), wait=False)

    async def leader(self, name: str = AUDITOR) -> str | None:
        """The current leader's candidate value, or None."""
        found = await self.holder(name)
        return found[0].decode() if found else None

    async def observe(self, name: str = AUDITOR) -> AsyncIterator[str | None]:
        """The leader now, then again every time leadership may have changed (duplicates dropped)."""
        pfx = self._pfx(name)
        resp = await self.etcd.range(pfx, prefix_end(pfx), limit=1, sort_target=rpc.RangeRequest.CREATE,
                                     sort_order=rpc.RangeRequest.ASCEND)
        current = resp.kvs[0].value.decode() if resp.kvs else None
        yield current
        async with Watch(self.etcd, pfx, prefix_end(pfx), start_revision=resp.header.revision + 1) as watch:
            async for _ in watch:
                now = await self.leader(name)
                if now != current:
                    current = now
                    yield now
