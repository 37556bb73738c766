"""Entries a bookie lost on disk come back: its scrubber drops them and marks their ledgers, and
autorecovery (with no periodic check, so only the bookie's own markers can drive it) copies them back
from the other replicas. Real etcd, real bookie and autorecovery processes, real damaged files."""
from __future__ import annotations

import asyncio
import os

import pytest

from pybk.client.bookie_client import BookieClient, BookieError, Status
from pybk.bookie.entrylog import LOG_HEADER
from pybk.client import BookKeeper
from pybk.ledger import entry_ranges
from pybk.meta import MetadataStore

from entrylog_files import records
from recovery_checks import PASSWORD, assert_fully_replicated, eventually, every_copy_written


@pytest.mark.parametrize("read_only_first", [False, True], ids=["writable", "read-only-first"])
async def test_entries_lost_on_disk_are_dropped_marked_and_rereplicated(bookies, short_lease_uri, autorecovery,
                                                                        read_only_first):
    """With read_only_first, the victim is read-only when autorecovery starts: its ledgers keep
    their markers (the worker says why) until it is writable again, and are then repaired."""
    # 1 KiB entry logs: every checkpoint (here: every clean restart) starts a new log file
    procs = bookies(3, metadata_uri=short_lease_uri, registration_ttl=2, entrylog_max_file_size="1KiB")
    victim = procs[0]
    addresses = {p.bookie_id: p.address for p in procs}
    store = await MetadataStore.connect(short_lease_uri)
    try:
        written: dict[int, list[bytes]] = {}
        for _ in range(3):  # one ledger per entry log of the victim
            # a client per ledger: one that kept its connection to the victim from before the restart
            # may find it broken at the first add, and with no spare bookie its entries, acked by the
            # other two, would never reach the victim; and it stays open until every bookie holds
            # every entry (an ack needs two: the third copy may still be on its way)
            async with await BookKeeper.connect(short_lease_uri) as bk:
                lh = await bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2, password=PASSWORD)
                payloads = [os.urandom(500) for _ in range(300)]
                await asyncio.gather(*(lh.add_entry_async(p) for p in payloads))
                await lh.close()
                written[lh.ledger_id] = payloads
                await eventually(lambda: every_copy_written(store, addresses, {lh.ledger_id: payloads}), 10,
                                 what="every bookie to hold the ledger")
            await asyncio.to_thread(victim.restart)
        flipped, cut, deleted = written
        await asyncio.to_thread(victim.stop)
        logs = sorted((victim.ledger_dirs[0] / "entrylogs").glob("entrylog-*.log"))
        held = [records(p) for p in logs[:3]]
        assert [{r[0] for r in recs} for recs in held] == [{flipped}, {cut}, {deleted}]

        with open(logs[0], "r+b") as f:  # bit rot in two records
            for _, e, off, n in held[0]:
                if e in (10, 250):
                    f.seek(off + n - 3)
                    f.write(b"\xde\xad\xbe")
        _, _, off, _ = next(r for r in held[1] if r[1] == 120)
        os.truncate(logs[1], off + LOG_HEADER + 7)  # cut inside entry 120's body
        logs[2].unlink()
        lost = {flipped: [10, 250], cut: list(range(120, 300)), deleted: list(range(300))}
        await asyncio.to_thread(victim.start)

        result = await asyncio.to_thread(victim.http_json, "/api/v1/bookie/scrub", "POST", None, 60)
        assert result["bad_by_ledger"] == {str(lid): [list(r) for r in entry_ranges(ids)]
                                           for lid, ids in sorted(lost.items())}, result
        assert result["marked_under_replicated"] == sorted(lost) and result["files_missing"] == [str(logs[2])]
        for lid in lost:
            marker = await store.underreplication.get(lid)
            assert marker is not None and marker.missing == [victim.bookie_id]
        async with await BookieClient.connect(victim.address) as c:
            for lid, ids in lost.items():
                assert await c.list_entries(lid) == entry_ranges(sorted(set(range(300)) - set(ids)))
                try:
                    await c.read(lid, ids[0])
                    raise AssertionError(f"entry {lid}:{ids[0]} still readable after the scrub dropped it")
                except BookieError as exc:
                    assert exc.code is Status.NO_ENTRY, exc

        if read_only_first:
            await asyncio.to_thread(victim.http_json, "/api/v1/bookie/state/readonly", "PUT", {"readOnly": True})
            await eventually(lambda: _read_only(store, victim.bookie_id), 20, what="the victim registered read-only")
        worker = autorecovery()
        if read_only_first:
            await eventually(lambda: _waits_for(worker, victim.bookie_id, lost), 60,
                             what="the worker to say each ledger waits for the read-only victim")
            assert sorted([m.ledger_id async for m in store.underreplication.list()]) == sorted(lost)
            await asyncio.to_thread(victim.http_json, "/api/v1/bookie/state/readonly", "PUT", {"readOnly": False})
        await eventually(lambda: _no_markers(store), 120, what="autorecovery to repair the scrubbed ledgers")
        await assert_fully_replicated(store, addresses, written)
    finally:
        await store.close()


async def _read_only(store, bookie_id: str) -> bool:
    return bookie_id in await store.registry.readonly()


def _waits_for(worker, bookie_id: str, ledgers) -> bool:
    status, body = worker.http_json("/api/v1/autorecovery/status")
    errors = body.get("worker_errors", {}) if status == 200 else {}
    return all(bookie_id in errors.get(str(lid), "") and "read-only" in errors[str(lid)] for lid in ledgers)


async def _no_markers(store) -> bool:
    return not await store.underreplication.count()
