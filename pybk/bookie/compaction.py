"""Reclaiming a bookie's space: forgetting ledgers deleted from the metadata, and rewriting entry
logs whose live fraction fell below the compaction threshold (garbage collection drives both:
gc.GarbageCollector)."""
from __future__ import annotations

import asyncio
import logging
import os

from .entrylog import LOG_HEADER, EntryLogCorruptError
from .storage import Storage

log = logging.getLogger("pybk.bookie")


async def delete_ledgers(storage: Storage, ledgers: set[int]) -> int:
    """Forget ledgers deleted from the metadata: state, cached entries and index locations.
    Returns the number of entries dropped; `compact()` then reclaims their entry log space."""
    async with storage.lock:
        dropped = 0
        for ledger in ledgers:
            storage.ledgers.pop(ledger, None)
            storage.forget_indexed(ledger)
            dropped += storage.cache.drop_ledger(ledger)
        dropped += await asyncio.get_running_loop().run_in_executor(None, storage.index.delete_ledgers, ledgers)
        storage.metrics.ledgers.set(len(storage.ledgers))
    await storage.checkpoint()  # moves the journal mark past their records, so replay cannot revive them
    return dropped


async def compact(storage: Storage, threshold: float) -> dict:
    """Rewrite entry logs (not the current ones) whose live fraction is under `threshold`:
    copy their live entries to the current log, repoint the index in one transaction, delete
    the old files. Returns {"rewritten_logs", "copied_entries", "reclaimed_bytes"}."""
    async with storage.lock:
        loop = asyncio.get_running_loop()
        plans = await loop.run_in_executor(None, _rewrite, storage, threshold)
        reclaimed = copied = 0
        while storage.disk_reads:  # reads in worker threads may still use the old locations
            await asyncio.sleep(0.005)
        for d, log_id, size, n in plans:
            storage.entrylogs[d].remove(log_id)  # on the loop thread: no read is between lookup and pread
            reclaimed += size
            copied += n
        return {"rewritten_logs": len(plans), "copied_entries": copied, "reclaimed_bytes": reclaimed}


def _rewrite(storage: Storage, threshold: float) -> list[tuple[int, int, int, int]]:
    """Worker thread: copy the live entries of each entry log under the threshold to the current
    log and repoint the index; returns (dir, log id, size, entries copied) of the logs to delete."""
    plans = []
    index = storage.index
    for d, el in enumerate(storage.entrylogs):
        candidates = set(el.log_ids()) - {el.current}
        if not candidates:
            continue
        live = index.live_locations(d, candidates)
        for log_id in sorted(candidates):
            entries = live.get(log_id, [])
            size = el.path(log_id).stat().st_size
            fd = os.open(el.path(log_id), os.O_RDONLY)
            try:
                items = [(ledger, entry, el.read_at(fd, log_id, off, ledger, entry))
                         for ledger, entry, off in entries]
            except EntryLogCorruptError as exc:
                log.error("compaction leaves %s alone: %s", el.path(log_id), exc)
                continue
            finally:
                os.close(fd)
            live_bytes = sum(len(b) + LOG_HEADER for _, _, b in items)
            if size == 0 or live_bytes / size >= threshold:
                continue
            if items:
                index.commit(el.append_sorted(sorted(items, key=lambda t: (t[0], t[1])), d), [])
            plans.append((d, log_id, size, len(items)))
    return plans
