"""Garbage collection: drop the ledgers deleted from the metadata store, then compact entry logs.

Runs every `gc_interval` seconds and on request (POST /api/v1/bookie/gc). A failed round is
logged and tried again next round: it never stops the bookie.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from pybk.config import option_field
from pybk.meta.ledgers import Ledgers

from .bookie import Bookie

log = logging.getLogger("pybk.bookie.gc")


@dataclass(frozen=True)
class Housekeeping:
    """How often the bookie collects garbage and scrubs (0: only on request), and which entry
    logs a collection rewrites."""

    gc_interval: float = option_field("gc_interval")
    compaction_threshold: float = option_field("compaction_threshold")  # live fraction below which a log is rewritten
    scrub_interval: float = option_field("scrub_interval")


class GarbageCollector:
    """Compares the ledgers the bookie holds with those in the metadata store."""

    def __init__(self, storage: Bookie, ledgers: Ledgers, options: Housekeeping):
        self.storage = storage
        self.ledgers = ledgers
        self.options = options
        self.interval = options.gc_interval  # seconds between rounds; 0 = only on request
        self.last: dict | None = None  # the report of the last round
        self._task: asyncio.Task | None = None

    async def collect(self) -> dict:
        """Drop the ledgers this bookie holds that no longer exist in the metadata store.

        The bookie's ledger set is taken before listing the metadata: a ledger's metadata is
        created before any of its entries reach a bookie, so every ledger in that set that is
        still alive shows up in the listing."""
        t0 = time.monotonic()
        mine = set(self.storage.ledgers)
        live = set()
        async for ledger_id in self.ledgers.list():
            live.add(ledger_id)
        dead = mine - live
        dropped = await self.storage.delete_ledgers(dead) if dead else 0
        compaction = await self.storage.compact(self.options.compaction_threshold)
        self.last = {"deleted_ledgers": sorted(dead), "dropped_entries": dropped, **compaction,
                     "seconds": round(time.monotonic() - t0, 3), "at": time.time()}
        self.storage.metrics.gc_collected(len(dead), compaction["reclaimed_bytes"], time.monotonic() - t0)
        if dead:
            log.info("garbage collection: dropped %d deleted ledgers (%d entries), reclaimed %d bytes",
                     len(dead), dropped, compaction["reclaimed_bytes"])
        return self.last

    def start(self) -> None:
        """Collect every `interval` seconds in the background (nothing when the interval is 0)."""
        if self.interval > 0:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="gc")

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.collect()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - try again next round
                log.warning("garbage collection failed: %s", exc)

    async def close(self) -> None:
        """Stop the background rounds (a round in progress is cancelled)."""
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
