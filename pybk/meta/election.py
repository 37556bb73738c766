"""Leader election (the auditor) on the lock queue: the candidate with the smallest
create_revision leads; a killed leader's key vanishes with its lease and the next takes over."""
from __future__ import annotations

from typing import AsyncIterator

from .etcd import prefix_end
from .locks import Lock, Queue
from .watch import watch_range

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
        """The leader now, then again every time leadership may have changed (duplicates dropped;
        a leader that came and went between two looks may not be told)."""
        pfx = self._pfx(name)
        current = await self.leader(name)
        yield current
        # initial: the keys as the watch first reads them count as changes, so a leader that
        # arrived between the look above and the watch's start is told too
        async for _ in watch_range(self.etcd, pfx, prefix_end(pfx), initial=True):
            now = await self.leader(name)
            if now != current:
                current = now
                yield now
