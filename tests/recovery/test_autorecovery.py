"""AutoRecovery promises, shown with real etcd, real bookie processes and real autorecovery processes."""
from __future__ import annotations

import asyncio
import os
import shutil

from pybk.client import BookKeeper
from pybk.meta import MetadataStore

from recovery_checks import PASSWORD, assert_fully_replicated, eventually, held_by_bookie


async def _write_ledgers(bk, closed: int, opened: int, entries: int, size: int = 200):
    """closed + opened ledgers E3/Qw3/Qa2 with `entries` acked entries each; returns
    (written payloads by ledger id, open handles)."""
    written: dict[int, list[bytes]] = {}
    handles = []
    for i in range(closed + opened):
        lh = await bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2, password=PASSWORD)
        payloads = [os.urandom(size) for _ in range(entries)]
        await asyncio.gather(*(lh.add_entry_async(p) for p in payloads))
        written[lh.ledger_id] = payloads
        if i < closed:
            await lh.close()
        else:
            handles.append(lh)
    return written, handles


async def _nothing_under_replicated(store, dead: str):
    if await store.underreplication.count():
        return False
    async for md in store.ledgers.list_metadata():
        if dead in md.bookies():
            return False
    return True


async def test_lost_bookie_is_rereplicated_to_the_full_write_quorum(bookies, short_lease_uri, autorecovery):
    procs = bookies(4, metadata_uri=short_lease_uri, registration_ttl=2)
    store = await MetadataStore.connect(short_lease_uri)
    bk = await BookKeeper.connect(short_lease_uri)
    try:
        written, handles = await _write_ledgers(bk, closed=4, opened=2, entries=300)
        counts = {p.bookie_id: 0 for p in procs}
        for lid in written:
            for b in (await store.ledgers.get(lid)).bookies():
                counts[b] += 1
        victim = next(p for p in procs if p.bookie_id == max(counts, key=counts.get))
        autorecovery()
        victim.kill()
        await eventually(lambda: _nothing_under_replicated(store, victim.bookie_id), 180,
                         what=f"no ledger under-replicated or on {victim.bookie_id}")
        alive = {p.bookie_id: p.address for p in procs if p is not victim}
        await assert_fully_replicated(store, alive, written)
        # an open ledger whose last fragment (where its writer goes on) named the lost bookie was fenced
        # and closed with every acked entry; one whose live writer replaced the bookie first (an
        # ensemble change of its own) stays open, its earlier fragments re-replicated
        for h in handles:
            md = await store.ledgers.get(h.ledger_id)
            assert md.is_closed == (victim.bookie_id in h.metadata.fragments[-1].bookies)
    finally:
        await bk.close()
        await store.close()


async def test_wiped_bookie_is_repaired_by_the_periodic_check(bookies, short_lease_uri, autorecovery):
    procs = bookies(3, metadata_uri=short_lease_uri)
    store = await MetadataStore.connect(short_lease_uri)
    bk = await BookKeeper.connect(short_lease_uri)
    try:
        written, _ = await _write_ledgers(bk, closed=3, opened=0, entries=200)
        victim = procs[1]
        victim.stop()
        shutil.rmtree(victim.journal_dir)
        for d in victim.ledger_dirs:
            shutil.rmtree(d)
        assert await store.cookies.delete(victim.bookie_id)
        victim.start()
        addresses = {p.bookie_id: p.address for p in procs}
        held = await held_by_bookie({victim.bookie_id: victim.address}, written)
        assert not any(held[victim.bookie_id].values()), "the wiped bookie still holds entries"
        # started once the wipe is seen (a check every second would otherwise race that look); the
        # lost-bookie path must not be what repairs it, only the periodic check
        autorecovery(lost_bookie_delay=600, audit_interval=1)

        async def repaired():
            try:
                await assert_fully_replicated(store, addresses, written)
            except AssertionError:
                return False
            return not await store.underreplication.count()

        await eventually(repaired, 120, what="the periodic check to restore the wiped bookie's replicas")
        await assert_fully_replicated(store, addresses, written)
    finally:
        await bk.close()
        await store.close()


async def test_auditor_killed_is_replaced_and_killed_worker_ledger_is_finished(bookies, short_lease_uri,
                                                                                autorecovery):
    procs = bookies(4, metadata_uri=short_lease_uri, registration_ttl=2)
    store = await MetadataStore.connect(short_lease_uri)
    bk = await BookKeeper.connect(short_lease_uri)
    try:
        # one big ledger, copied slowly (small batches, one run at a time) so a worker is caught mid-ledger
        lh = await bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2, password=PASSWORD)
        payloads = [os.urandom(1024) for _ in range(20000)]
        for i in range(0, len(payloads), 1000):
            await asyncio.gather(*(lh.add_entry_async(p) for p in payloads[i:i + 1000]))
        await lh.close()
        written = {lh.ledger_id: payloads}
        slow = dict(replication_batch=4)
        first = autorecovery(**slow)
        await eventually(lambda: _auditor_is(store, first.recovery_name), 60, what="the first process to lead")
        second = autorecovery(**slow)

        # the auditor dies: the other process takes over within the lease TTL (2 s) plus margin
        first.kill()
        await eventually(lambda: _auditor_is(store, second.recovery_name), 60, what="the second process to lead")

        # the new auditor notices a lost bookie; kill the worker copying its ledger mid-way
        ensemble = (await store.ledgers.get(lh.ledger_id)).bookies()
        victim = next(p for p in procs if p.bookie_id in ensemble)
        victim.kill()

        seen = {}

        async def second_busy():
            status, seen["status"] = second.http_json("/api/v1/autorecovery/status")
            return status == 200 and lh.ledger_id in seen["status"]["worker_busy"]

        try:
            await eventually(second_busy, 60, interval=0.05, what="the worker to start copying")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last status {seen.get('status')}; log:\n{second.log_tail(40)}") from None
        await asyncio.sleep(0.2)
        second.kill()
        assert await store.underreplication.get(lh.ledger_id) is not None, "finished before it was killed"
        assert victim.bookie_id in (await store.ledgers.get(lh.ledger_id)).bookies()
        third = autorecovery()
        await eventually(lambda: _nothing_under_replicated(store, victim.bookie_id), 180,
                         what="a third process to finish the killed worker's ledger")
        status, who = third.http_json("/api/v1/autorecovery/who_is_auditor")
        assert status == 200 and who["id"] == third.recovery_name
        alive = {p.bookie_id: p.address for p in procs if p is not victim}
        await assert_fully_replicated(store, alive, written)
    finally:
        await bk.close()
        await store.close()


async def _auditor_is(store, name: str) -> bool:
    from pybk.recovery import admin
    who = await admin.who_is_auditor(store)
    return who is not None and who["id"] == name


async def test_decommission_while_a_writer_keeps_adding(bookies, short_lease_uri, autorecovery):
    from pybk.recovery import admin

    procs = bookies(4, metadata_uri=short_lease_uri, registration_ttl=2)
    store = await MetadataStore.connect(short_lease_uri)
    bk = await BookKeeper.connect(short_lease_uri)
    writer_task = None
    try:
        written, _ = await _write_ledgers(bk, closed=3, opened=0, entries=200)
        lh = await bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2, password=PASSWORD)
        acked: list[bytes] = []
        stop = asyncio.Event()

        async def writer():
            while not stop.is_set():
                batch = [os.urandom(300) for _ in range(20)]
                ids = await asyncio.gather(*(lh.add_entry_async(p) for p in batch))
                assert ids == list(range(len(acked), len(acked) + len(batch)))
                acked.extend(batch)
                await asyncio.sleep(0.01)

        writer_task = asyncio.ensure_future(writer())
        await eventually(lambda: _true(len(acked) >= 200), 60, what="the writer to get going")
        autorecovery()
        victim = next(p for p in procs if p.bookie_id in lh.metadata.current_ensemble)
        seen = []
        result = await admin.decommission_bookie(store, victim.bookie_id, wait=True, on_progress=seen.append,
                                                 timeout=180)
        assert result["done"] and result["remaining"] == 0
        assert seen and seen[0].total >= 1 and seen[-1].done
        assert len(acked) > 200 and not writer_task.done(), "the writer must still be adding"
        stop.set()
        await writer_task
        await lh.close()
        written[lh.ledger_id] = acked
        async for md in store.ledgers.list_metadata():
            assert victim.bookie_id not in md.bookies(), f"ledger {md.ledger_id} still references {victim.bookie_id}"
        assert await store.cookies.get(victim.bookie_id) is None
        others = {p.bookie_id: p.address for p in procs if p is not victim}
        await eventually(lambda: _true(True), 1)
        await assert_fully_replicated(store, others, written)
        rh = await bk.open_ledger(lh.ledger_id, password=PASSWORD)
        got = [e.data async for e in rh.read_entries(0, rh.last_add_confirmed)]
        assert got == acked
    finally:
        if writer_task is not None:
            writer_task.cancel()
        await bk.close()
        await store.close()


async def _true(value) -> bool:
    return bool(value)


def _auditor(bookie) -> str | None:
    """The auditor's id as a bookie's admin API names it (None while nobody leads)."""
    who = bookie.http_json("/api/v1/autorecovery/who_is_auditor")
    return who.get("id") if who else None


async def test_autorecovery_inside_bookies_rereplicates_a_killed_bookie(bookies, short_lease_uri, monkeypatch):
    monkeypatch.setenv("PYBK_LOST_BOOKIE_DELAY", "1")
    monkeypatch.setenv("PYBK_RECOVERY_POLL_INTERVAL", "0.2")
    monkeypatch.setenv("PYBK_LEDGER_PASSWORDS", PASSWORD.decode())
    procs = bookies(4, metadata_uri=short_lease_uri, registration_ttl=2, autorecovery=True)
    store = await MetadataStore.connect(short_lease_uri)
    bk = await BookKeeper.connect(short_lease_uri)
    try:
        written, _ = await _write_ledgers(bk, closed=4, opened=0, entries=100)
        who = procs[0].http_json("/api/v1/autorecovery/who_is_auditor")
        # kill the auditor's bookie: another bookie's autorecovery takes over and repairs
        victim = next(p for p in procs if p.bookie_id == who["id"])
        victim.kill()
        await eventually(lambda: _nothing_under_replicated(store, victim.bookie_id), 180,
                         what=f"no ledger under-replicated or on {victim.bookie_id}")
        survivor = next(p for p in procs if p is not victim)
        # the victim's election key lives until its lease runs out, which may be after the repair
        # (nothing to repair when no ledger was on it)
        await eventually(lambda: _true(_auditor(survivor) not in (None, victim.bookie_id)), 30,
                         what="another bookie's auditor")
        assert survivor.http_json("/api/v1/autorecovery/list_under_replicated_ledger") == []
        await assert_fully_replicated(store, {p.bookie_id: p.address for p in procs if p is not victim}, written)
    finally:
        await bk.close()
        await store.close()


async def test_an_autorecovery_whose_worker_stops_by_itself_ends_naming_it(short_lease_uri):
    """The worker and the auditor campaign loop for ever: when one ends anyway (here the worker,
    cancelled from inside), run() stops the other too and raises RecoveryStopped naming it, so the
    process exits non-zero instead of idling on as half an autorecovery."""
    from pybk.recovery.options import RecoveryOptions
    from pybk.autorecovery.service import AutoRecovery, RecoveryStopped

    store = await MetadataStore.connect(short_lease_uri)
    try:
        recovery = AutoRecovery(store, short_lease_uri, RecoveryOptions(poll_interval=0.2), name="test")
        run = asyncio.ensure_future(recovery.run())

        def part(name: str) -> asyncio.Task | None:
            return next((t for t in asyncio.all_tasks() if t.get_name() == name), None)

        await eventually(lambda: part("replication worker") is not None and recovery.is_auditor, timeout=30,
                         what="the worker running and the auditor elected")
        campaign = part("auditor campaign")
        part("replication worker").cancel()
        done, _ = await asyncio.wait({run}, timeout=30)
        assert run in done
        error = run.exception()
        assert isinstance(error, RecoveryStopped)
        assert str(error) == "autorecovery test: its replication worker stopped: it was cancelled"
        assert campaign.done()
    finally:
        await store.close()
