"""The replication protocol's promises, each shown on real etcd and real bookie
processes. Every fault test checks that no acknowledged entry is lost or changed."""
from __future__ import annotations

import asyncio
import signal

import pytest
from client_helpers import ChildWriter, expected, flip_in_entry_logs, payload, pipelined, read_all
from polling import eventually

from pybk.client.bookie_client import BookieError
from pybk.client import BookKeeper, ClientOptions, LedgerClosedError, LedgerFencedError, NotEnoughBookiesError
from pybk.entry import DigestMismatch, decode
from pybk.ledger import write_set
from pybk.meta import LedgerState


async def _holdings(bk, md) -> dict[str, set[int]]:
    out = {}
    for b in md.bookies():
        c = await bk.client(b)
        out[b] = {e for a, z in await c.list_entries(md.ledger_id) for e in range(a, z + 1)}
    return out


async def test_entry_is_stored_on_the_write_quorum_from_index_entry_mod_ensemble(cluster_factory):
    cluster = cluster_factory(5)
    async with await BookKeeper.connect(cluster.uri) as bk:
        lh = await bk.create_ledger(ensemble=5, write_quorum=3, ack_quorum=3, password=b"pw")
        await pipelined(lh, 40)
        await lh.close()
        md = lh.metadata
        ensemble = md.fragments[0].bookies
        want = {b: set() for b in ensemble}
        for e in range(40):
            for i in write_set(e, 5, 3):
                want[ensemble[i]].add(e)
        assert await _holdings(bk, md) == want


async def test_adds_made_one_at_a_time_still_reach_every_bookie_of_their_write_set(cluster_factory):
    """A lone add sends its copies beyond the ack quorum once it is acked (they ride in the next
    add's messages): every bookie of the write set still stores every entry."""
    cluster = cluster_factory(3)
    async with await BookKeeper.connect(cluster.uri) as bk:
        lh = await bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2, password=b"pw")
        acked = [await lh.add_entry(payload(lh.ledger_id, e)) for e in range(20)]
        assert acked == list(range(20))
        md = lh.metadata
        want = {b: set(range(20)) for b in md.fragments[0].bookies}

        async def stored():
            return await _holdings(bk, md) == want
        await eventually(stored, what="every entry on all three bookies")
        await lh.close()
        rh = await bk.open_ledger(lh.ledger_id, password=b"pw")
        assert await read_all(rh) == expected(lh.ledger_id, 19)


async def test_a_lone_add_is_acked_without_an_ensemble_change_while_one_of_its_first_bookies_stalls(
        cluster_factory):
    """The copies a lone add holds back go out after tail_hold_delay even without its ack: a
    stalled bookie among its first Qa costs that delay, not the add timeout and an ensemble change."""
    cluster = cluster_factory(3)
    async with await BookKeeper.connect(cluster.uri, ClientOptions(add_timeout=120.0)) as bk:
        lh = await bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2, password=b"pw")
        assert await lh.add_entry(payload(lh.ledger_id, 0)) == 0
        ensemble = lh.metadata.fragments[0].bookies
        stalled = cluster.by_id(ensemble[write_set(1, 3, 3)[0]])  # one of entry 1's first two
        stalled.signal(signal.SIGSTOP)
        try:
            assert await asyncio.wait_for(lh.add_entry(payload(lh.ledger_id, 1)), 60) == 1
            assert lh.metadata.fragments[0].bookies == ensemble and len(lh.metadata.fragments) == 1
        finally:
            stalled.signal(signal.SIGCONT)
        await lh.close()
        rh = await bk.open_ledger(lh.ledger_id, password=b"pw")
        assert await read_all(rh) == expected(lh.ledger_id, 1)


async def test_kill_one_bookie_mid_stream_changes_ensemble_and_keeps_every_acked_entry(cluster_factory):
    cluster = cluster_factory(4)
    async with await BookKeeper.connect(cluster.uri) as bk:
        lh = await bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2, password=b"pw")
        victim = lh.metadata.fragments[0].bookies[1]
        fragments_at_ack: dict[int, int] = {}
        killed = asyncio.Event()

        def on_ack(eid):
            fragments_at_ack[eid] = len(lh.metadata.fragments)
            if eid == 300 and not killed.is_set():
                killed.set()
                cluster.by_id(victim).kill()

        acked = await pipelined(lh, 1500, window=100, on_ack=on_ack)
        assert acked == list(range(1500))          # writing went on through the failure
        md = lh.metadata
        assert len(md.fragments) == 2
        first = md.fragments[1].first_entry_id
        old, new = md.fragments[0].bookies, md.fragments[1].bookies
        assert [i for i in range(3) if old[i] != new[i]] == [1] and victim not in new
        # the fragment starts at the first entry not yet acked when the change began
        assert 300 < first <= 1500 and fragments_at_ack[first - 1] == 1
        # pending entries were resent: the replacement holds every entry from the fragment on
        await lh.close()
        replacement = await bk.client(new[1])
        for _ in range(300):       # acks needed only Qa = 2 copies: the third may still be landing
            held = {e for a, z in await replacement.list_entries(lh.ledger_id) for e in range(a, z + 1)}
            if set(range(first, 1500)) <= held:
                break
            await asyncio.sleep(0.1)
        assert set(range(first, 1500)) <= held
        rh = await bk.open_ledger(lh.ledger_id, password=b"pw")
        assert rh.last_add_confirmed == 1499
        assert await read_all(rh) == expected(lh.ledger_id, 1499)


async def test_second_writer_fences_the_first_and_all_readers_agree(cluster_factory):
    cluster = cluster_factory(3)
    async with await BookKeeper.connect(cluster.uri) as bk1, await BookKeeper.connect(cluster.uri) as bk2:
        lh = await bk1.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2, password=b"pw")
        acked: list[int] = []
        errors: list[BaseException] = []
        stop = asyncio.Event()

        async def writer():
            sem = asyncio.Semaphore(32)

            def done(fut):
                sem.release()
                if fut.exception() is None:
                    acked.append(fut.result())
                else:
                    errors.append(fut.exception())
                    stop.set()

            i = 0
            while not stop.is_set() and i < 200_000:
                await sem.acquire()
                lh.add_entry_async(payload(lh.ledger_id, i)).add_done_callback(done)
                i += 1
            await asyncio.sleep(0.2)
            # a later add after the fence fails too
            with pytest.raises(LedgerFencedError):
                await lh.add_entry(b"late")

        task = asyncio.ensure_future(writer())
        while len(acked) < 300:
            await asyncio.sleep(0.01)
        rh = await bk2.open_ledger(lh.ledger_id, password=b"pw")       # fences and recovers
        await asyncio.wait_for(task, 60)
        assert errors and all(isinstance(e, LedgerFencedError) for e in errors)
        last = rh.last_add_confirmed
        assert rh.metadata.state is LedgerState.CLOSED
        assert last >= max(acked) and sorted(acked) == list(range(len(acked)))
        seqs = [await read_all(rh)]
        async with await BookKeeper.connect(cluster.uri) as bk3:
            for recovery in (True, False):
                h = await bk3.open_ledger(lh.ledger_id, password=b"pw", recovery=recovery)
                seqs.append(await read_all(h))
        assert seqs[0] == seqs[1] == seqs[2] == expected(lh.ledger_id, last)
        if last == lh.last_add_confirmed:      # closed where this writer stopped: its close succeeds
            await lh.close()
        else:                                  # recovery found entries the writer never saw acked
            with pytest.raises(LedgerClosedError):
                await lh.close()


async def test_writer_killed_mid_stream_recovery_closes_with_every_acked_entry(cluster_factory, tmp_path):
    cluster = cluster_factory(3)
    child = ChildWriter(cluster.uri, tmp_path / "writer.log", count=-1, window=64).start()
    try:
        await child.wait_acked(500)
    finally:
        child.kill()
    acked = child.acked()
    lid = child.ledger_id
    async with await BookKeeper.connect(cluster.uri) as bk, await BookKeeper.connect(cluster.uri) as bk2:
        assert (await bk.ledger_metadata(lid)).state is LedgerState.OPEN
        # two readers recover at once: every step is a CAS, so they converge on one last entry
        rh, rh2 = await asyncio.gather(bk.open_ledger(lid, password=b"pw"), bk2.open_ledger(lid, password=b"pw"))
        assert rh.metadata.state is rh2.metadata.state is LedgerState.CLOSED
        last = rh.metadata.last_entry_id
        assert rh2.metadata.last_entry_id == last >= max(acked)
        assert await read_all(rh) == await read_all(rh2) == expected(lid, last)
        # the length comes from the running length in the last entry's header
        assert rh.metadata.length == rh2.metadata.length == sum(len(p) for _, p in expected(lid, last))


async def test_tailing_reader_wakes_on_long_poll_as_writer_adds(cluster_factory):
    cluster = cluster_factory(3)
    async with await BookKeeper.connect(cluster.uri) as bk, await BookKeeper.connect(cluster.uri) as bk2:
        lh = await bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2, password=b"pw")
        await lh.add_entry(payload(lh.ledger_id, 0))
        rh = await bk2.open_ledger(lh.ledger_id, password=b"pw", recovery=False)
        assert rh.metadata.state is LedgerState.OPEN       # no fencing, the writer goes on

        async def write():
            for i in range(1, 20):
                await asyncio.sleep(0.05)
                await lh.add_entry(payload(lh.ledger_id, i))

        writer = asyncio.ensure_future(write())
        seen: list[tuple[int, bytes]] = []
        lac = -1
        while lac < 19:
            new = await rh.wait_last_add_confirmed(lac, timeout=30)
            assert new > lac, "long-poll returned without a newer LAC"
            seen += await read_all(rh, lac + 1, new)
            lac = new
        await writer
        assert seen == expected(lh.ledger_id, 19)
        await lh.add_entry(payload(lh.ledger_id, 20))     # the writer was never fenced
        await lh.close()
        assert await rh.wait_last_add_confirmed(20, timeout=30) == 20    # the reader learns of the close
        assert rh.is_closed and await read_all(rh) == expected(lh.ledger_id, 20)


async def test_a_writer_that_goes_idle_tells_the_lac_once_and_one_awaiting_each_add_lets_the_next_add_tell_it(
        cluster_factory):
    """With no explicit_lac_delay (the default), adds made one at a time each carry the LAC of the
    one before, so no WriteLac goes between them; once the writer stops, one WriteLac round tells
    every bookie the last LAC, and a reader sees the last entry without another add."""
    cluster = cluster_factory(3)
    async with await BookKeeper.connect(cluster.uri) as bk, await BookKeeper.connect(cluster.uri) as bk2:
        lh = await bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2, password=b"pw")
        told: list[int] = []
        for c in lh._clients:
            write_lac = c.write_lac

            async def counted(ledger_id, lac, master_key, write_lac=write_lac):
                told.append(lac)
                await write_lac(ledger_id, lac, master_key)
            c.write_lac = counted
        for e in range(10):
            await lh.add_entry(payload(lh.ledger_id, e))
        rh = await bk2.open_ledger(lh.ledger_id, password=b"pw", recovery=False)

        async def readable():
            return await rh.read_last_add_confirmed() == 9
        await eventually(readable, what="the reader to see the last entry")
        assert told == [9, 9, 9]
        await lh.close()


async def test_corrupted_replica_is_detected_and_read_from_another(cluster_factory, caplog):
    cluster = cluster_factory(3)
    async with await BookKeeper.connect(cluster.uri) as bk:
        lh = await bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=3, password=b"pw")
        await pipelined(lh, 30)
        await lh.close()
        victim_id = lh.metadata.fragments[0].bookies[0]     # first replica of entries 0, 3, 6, ...
        victim = cluster.by_id(victim_id)
        victim.stop()                                        # a clean stop checkpoints to the entry log
        assert flip_in_entry_logs(victim, payload(lh.ledger_id, 3)) == 1
        victim.start()
        c = await bk.client(victim_id)
        with pytest.raises(DigestMismatch):                  # the replica really is corrupt
            decode(await c.read(lh.ledger_id, 3), lh.metadata.digest_type, b"pw")
        rh = await bk.open_ledger(lh.ledger_id, password=b"pw")
        assert await rh.read_entry(3) == payload(lh.ledger_id, 3)
        assert bk.digest_mismatches == 1
        assert await read_all(rh) == expected(lh.ledger_id, 29)   # range read falls over at entry 3
        assert bk.digest_mismatches == 2
        assert f"corrupt replica on bookie {victim_id}" in caplog.text


async def test_a_rotted_record_is_refused_to_copiers_and_caught_by_readers_that_check_digests(cluster_factory):
    """A bookie checks its records' CRCs for readers that cannot check digests (a keyless copier)
    and skips them for readers that say they check every digest themselves, which then catch a
    rotted record by its digest and read it from another replica."""
    cluster = cluster_factory(3)
    async with await BookKeeper.connect(cluster.uri) as bk:
        lh = await bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=3, password=b"pw")
        await pipelined(lh, 30)
        await lh.close()
        victim_id = lh.metadata.fragments[0].bookies[0]     # range reads start on the first replica
        victim = cluster.by_id(victim_id)
        victim.stop()                                        # a clean stop checkpoints to the entry log
        assert flip_in_entry_logs(victim, payload(lh.ledger_id, 3), reseal=False) == 1
        victim.start()
        c = await bk.client(victim_id)
        with pytest.raises(BookieError, match="3 fails its checksum"):
            await c.read(lh.ledger_id, 3)
        [(first, bodies, sizes)] = [a async for a in c.read_packed(lh.ledger_id, 3, 3, digests_checked=True)]
        with pytest.raises(DigestMismatch):
            decode(bodies, lh.metadata.digest_type, b"pw")
        rh = await bk.open_ledger(lh.ledger_id, password=b"pw")
        assert await read_all(rh) == expected(lh.ledger_id, 29)
        assert bk.digest_mismatches == 1


async def test_close_losing_its_cas_to_recovery_follows_the_close_rules(cluster_factory):
    cluster = cluster_factory(3)
    async with await BookKeeper.connect(cluster.uri) as bk, await BookKeeper.connect(cluster.uri) as bk2:
        store = bk2.store
        # CLOSED by recovery at the writer's own last entry -> the writer's close succeeds
        lh = await bk.create_ledger(3, 3, 2, password=b"pw")
        for i in range(10):
            await lh.add_entry(payload(lh.ledger_id, i))
        rh = await bk2.open_ledger(lh.ledger_id, password=b"pw")
        assert rh.metadata.last_entry_id == 9
        await lh.close()
        assert lh.metadata.state is LedgerState.CLOSED and lh.metadata.last_entry_id == 9

        # IN_RECOVERY (a recovery that has only taken step 1) -> the close fails as fenced
        lh = await bk.create_ledger(3, 3, 2, password=b"pw")
        await lh.add_entry(b"a")
        md = await store.ledgers.get(lh.ledger_id)
        await store.ledgers.cas(md.replace(state=LedgerState.IN_RECOVERY))
        with pytest.raises(LedgerFencedError, match="recovering"):
            await lh.close()
        assert (await store.ledgers.get(lh.ledger_id)).state is LedgerState.IN_RECOVERY

        # CLOSED at another last entry (recovery found an entry the writer never saw acked) -> error
        lh = await bk.create_ledger(3, 3, 2, password=b"pw")
        await lh.add_entry(b"a")
        md = await store.ledgers.get(lh.ledger_id)
        await store.ledgers.cas(md.replace(state=LedgerState.CLOSED, last_entry_id=1))
        with pytest.raises(LedgerClosedError, match="closed by someone else at last entry 1"):
            await lh.close()
        assert (await store.ledgers.get(lh.ledger_id)).last_entry_id == 1

        # still OPEN but changed (another version) -> the close retries and succeeds
        lh = await bk.create_ledger(3, 3, 2, password=b"pw")
        await lh.add_entry(b"a")
        await lh.add_entry(b"b")
        md = await store.ledgers.get(lh.ledger_id)
        await store.ledgers.cas(md.replace(custom={"touched": b"1"}))
        await lh.close()
        md = await store.ledgers.get(lh.ledger_id)
        assert (md.state, md.last_entry_id, md.custom) == (LedgerState.CLOSED, 1, {"touched": b"1"})
        with pytest.raises(LedgerClosedError):
            await lh.add_entry(b"c")


async def test_ensemble_change_losing_its_cas_to_recovery_or_close_fails_pending_adds(cluster_factory):
    cluster = cluster_factory(5)
    async with await BookKeeper.connect(cluster.uri) as bk, await BookKeeper.connect(cluster.uri) as bk2:
        store = bk2.store
        for state, error in ((LedgerState.IN_RECOVERY, LedgerFencedError), (LedgerState.CLOSED, LedgerClosedError)):
            lh = await bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=3, password=b"pw")
            for i in range(5):
                await lh.add_entry(payload(lh.ledger_id, i))
            md = await store.ledgers.get(lh.ledger_id)
            await store.ledgers.cas(md.replace(state=state, last_entry_id=4))   # someone else moved first
            cluster.by_id(lh.metadata.fragments[0].bookies[2]).kill()           # forces an ensemble change
            futs = [lh.add_entry_async(payload(lh.ledger_id, i)) for i in range(5, 10)]
            for f in futs:
                with pytest.raises(error):
                    await f
            assert (await store.ledgers.get(lh.ledger_id)).fragments == md.fragments   # no fragment added


async def test_reads_move_to_the_next_replica_on_error_or_when_a_replica_stalls(cluster_factory):
    cluster = cluster_factory(3)
    # a read that waited for a stalled replica's timeout would take a minute per entry
    slow = ClientOptions(read_timeout=60.0, speculative_read_delay=0.05)
    async with await BookKeeper.connect(cluster.uri, slow) as bk:
        lh = await bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=3, password=b"pw")
        await pipelined(lh, 30)
        await lh.close()
        ensemble = lh.metadata.fragments[0].bookies
        stalled = cluster.by_id(ensemble[0])
        stalled.signal(signal.SIGSTOP)
        try:
            rh = await bk.open_ledger(lh.ledger_id, password=b"pw")
            got = [(e, await rh.read_entry(e)) for e in range(30)]       # one at a time: speculative reads
            assert got == expected(lh.ledger_id, 29)
            assert await read_all(rh) == expected(lh.ledger_id, 29)      # range reads fall over too
        finally:
            stalled.signal(signal.SIGCONT)
        cluster.by_id(ensemble[1]).kill()                               # an error: the next replica answers
        rh = await bk.open_ledger(lh.ledger_id, password=b"pw")
        assert [(e, await rh.read_entry(e)) for e in range(30)] == expected(lh.ledger_id, 29)
        assert await read_all(rh) == expected(lh.ledger_id, 29)


async def test_a_stalled_bookie_is_replaced_after_the_add_timeout(cluster_factory):
    cluster = cluster_factory(4)
    async with await BookKeeper.connect(cluster.uri, ClientOptions(add_timeout=1.0)) as bk:
        lh = await bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=3, password=b"pw")
        stalled = cluster.by_id(lh.metadata.fragments[0].bookies[2])

        def on_ack(eid):
            if eid == 100:
                stalled.signal(signal.SIGSTOP)       # alive, connected, silent
        try:
            acked = await pipelined(lh, 400, window=32, on_ack=on_ack)
        finally:
            stalled.signal(signal.SIGCONT)
        assert acked == list(range(400))
        assert len(lh.metadata.fragments) == 2 and stalled.bookie_id not in lh.metadata.fragments[1].bookies
        await lh.close()
        rh = await bk.open_ledger(lh.ledger_id, password=b"pw")
        assert await read_all(rh) == expected(lh.ledger_id, 399)


async def test_without_a_spare_bookie_writes_go_on_with_ack_quorum_and_close(cluster_factory):
    cluster = cluster_factory(3)
    async with await BookKeeper.connect(cluster.uri) as bk:
        lh = await bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2, password=b"pw")
        victim = lh.metadata.fragments[0].bookies[0]

        def on_ack(eid):
            if eid == 50:
                cluster.by_id(victim).kill()
        acked = await pipelined(lh, 300, window=16, on_ack=on_ack)
        assert acked == list(range(300))
        await asyncio.wait_for(lh.close(), 60)
        assert lh.metadata.state is LedgerState.CLOSED and lh.metadata.last_entry_id == 299
        rh = await bk.open_ledger(lh.ledger_id, password=b"pw")
        assert await read_all(rh) == expected(lh.ledger_id, 299)
        # with two of three bookies gone no write quorum has Qa left: adds fail, saying why
        while victim in await bk.writable_bookies():      # its registration lease runs out
            await asyncio.sleep(0.2)
        lh = await bk.create_ledger(ensemble=2, write_quorum=2, ack_quorum=2, password=b"pw")
        await lh.add_entry(b"a")
        cluster.by_id(lh.metadata.current_ensemble[0]).kill()
        with pytest.raises(NotEnoughBookiesError, match="needed 1, found 0"):
            await lh.add_entry(b"b")
