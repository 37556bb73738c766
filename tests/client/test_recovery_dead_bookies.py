"""Recovery through dead bookies, and its batched read-forward, on real etcd and real bookie
processes. A crashed writer is played by storing entries on their write sets directly, with a
piggybacked LAC that stops short, so recovery has a known stretch of entries past the LAC."""
from __future__ import annotations

import asyncio

import pytest
from client_helpers import expected, flip_in_entry_logs, payload, read_all

from pybk.client import BookKeeper, ClientOptions, LedgerRecoveryError, NotEnoughBookiesError
from pybk.client.recovery import close_recovered, first_short, next_batch_size, recovery_fragment
from pybk.entry import encode, master_key
from pybk.meta import LedgerState
from pybk.meta.ledgers import Fragment, LedgerMetadata

PW = b"pw"


async def crashed_writer(bk, e: int, qw: int, qa: int, last: int, lac: int, skip: frozenset[int] = frozenset()):
    """A ledger whose writer stored entries 0..last (but `skip`) on their whole write sets and
    died with its LAC at `lac`: entries after `lac` carry it, as a writer's last adds would."""
    lh = await bk.create_ledger(ensemble=e, write_quorum=qw, ack_quorum=qa, password=PW)
    md = lh.metadata
    lid, mk = md.ledger_id, master_key(PW)
    length = 0
    adds = []
    for eid in range(last + 1):
        data = payload(lid, eid)
        length += len(data)
        if eid in skip:
            continue
        body = encode(lid, eid, min(eid - 1, lac), data, md.digest_type, PW, length)
        for b in md.write_set(eid):
            adds.append((await bk.client(b)).add(lid, eid, body, master_key=mk))
    await asyncio.gather(*adds)
    return md


async def recover_with_a_dead_bookie(cluster, e: int, qw: int, qa: int, options: ClientOptions | None = None):
    """Write 0..299 with the LAC at 99, kill one bookie of the ensemble, open with recovery."""
    async with await BookKeeper.connect(cluster.uri) as bk:
        md = await crashed_writer(bk, e, qw, qa, last=299, lac=99)
    dead = md.current_ensemble[1]
    cluster.by_id(dead).kill()
    async with await BookKeeper.connect(cluster.uri, options) as bk:
        rh = await bk.open_ledger(md.ledger_id, password=PW)
        return md, dead, rh, await read_all(rh)


@pytest.mark.parametrize("e,qw,qa", [(3, 2, 2), (5, 3, 3)])
async def test_recovery_replaces_a_dead_bookie_of_the_last_ensemble_with_a_spare(cluster_factory, e, qw, qa):
    cluster = cluster_factory(e + 1)
    md, dead, rh, entries = await recover_with_a_dead_bookie(cluster, e, qw, qa)
    closed = rh.metadata
    assert closed.state is LedgerState.CLOSED and closed.last_entry_id == 299
    assert closed.length == sum(len(p) for _, p in expected(md.ledger_id, 299))
    assert entries == expected(md.ledger_id, 299)
    spare = ({b.bookie_id for b in cluster.bookies} - set(md.current_ensemble)).pop()
    new = closed.current_ensemble
    assert len(closed.fragments) == 2 and 100 <= closed.fragments[-1].first_entry_id <= 299
    assert dead not in new and spare in new
    assert [b for b in new if b not in md.current_ensemble] == [spare]


async def test_recovery_without_a_spare_bookie_fails_naming_the_dead_bookie(cluster_factory):
    cluster = cluster_factory(3)
    async with await BookKeeper.connect(cluster.uri) as bk:
        md = await crashed_writer(bk, 3, 2, 2, last=99, lac=9)
    dead = md.current_ensemble[0]
    cluster.by_id(dead).kill()
    async with await BookKeeper.connect(cluster.uri) as bk:
        with pytest.raises(LedgerRecoveryError) as err:
            await bk.open_ledger(md.ledger_id, password=PW)
        first_line = str(err.value).splitlines()[0]
        assert dead in first_line and "no writable bookie" in first_line
        stored = await bk.ledger_metadata(md.ledger_id)
        assert stored.state is LedgerState.IN_RECOVERY and stored.fragments == md.fragments
    cluster.restart(cluster.by_id(dead))          # the bookie is back: the next open recovers
    async with await BookKeeper.connect(cluster.uri) as bk:
        for _ in range(100):
            if dead in await bk.writable_bookies():
                break
            await asyncio.sleep(0.1)
        rh = await bk.open_ledger(md.ledger_id, password=PW)
        assert rh.metadata.last_entry_id == 99 and rh.metadata.fragments == md.fragments
        assert await read_all(rh) == expected(md.ledger_id, 99)


@pytest.mark.parametrize("batch", [1, 7, 256])
async def test_batched_recovery_stops_at_the_first_missing_entry(cluster_factory, batch):
    cluster = cluster_factory(3)
    async with await BookKeeper.connect(cluster.uri) as bk:
        md = await crashed_writer(bk, 3, 3, 2, last=150, lac=20, skip=frozenset({100}))
    async with await BookKeeper.connect(cluster.uri, ClientOptions(recovery_batch_size=batch)) as bk:
        rh = await bk.open_ledger(md.ledger_id, password=PW)
        assert rh.metadata.last_entry_id == 99
        assert await read_all(rh) == expected(md.ledger_id, 99)
        assert rh.metadata.length == sum(len(p) for _, p in expected(md.ledger_id, 99))



async def test_recovery_takes_an_entry_from_another_replica_when_the_streamed_copy_is_corrupt(cluster_factory):
    cluster = cluster_factory(3)
    async with await BookKeeper.connect(cluster.uri) as bk:
        md = await crashed_writer(bk, 3, 3, 2, last=59, lac=9)
    victim = cluster.by_id(md.write_set(30)[0])    # the replica its stripe is streamed from first
    victim.stop()                                   # a clean stop checkpoints to the entry log
    assert flip_in_entry_logs(victim, payload(md.ledger_id, 30)) == 1
    victim.start()
    async with await BookKeeper.connect(cluster.uri) as bk:
        rh = await bk.open_ledger(md.ledger_id, password=PW)
        assert rh.metadata.last_entry_id == 59 and bk.digest_mismatches >= 1
        assert await read_all(rh) == expected(md.ledger_id, 59)


def in_recovery(fragments: list[Fragment]) -> LedgerMetadata:
    return LedgerMetadata(ledger_id=9, ensemble_size=3, write_quorum=2, ack_quorum=2,
                          state=LedgerState.IN_RECOVERY, version=5, fragments=fragments)


def test_recovery_fragment_replaces_only_the_failed_bookies_by_writable_ones_outside_the_ensemble():
    md = in_recovery([Fragment(0, ["a", "b", "c"])])
    assert recovery_fragment(md, 40, {"b"}, {"a": None, "b": None, "c": None, "d": None}) == \
        Fragment(40, ["a", "d", "c"])
    with pytest.raises(NotEnoughBookiesError):   # the failed bookie, though still registered, is no spare
        recovery_fragment(md, 40, {"b"}, {"a": None, "b": None, "c": None})


def test_a_batch_falls_short_at_its_first_entry_stored_on_fewer_than_qa_bookies():
    assert first_short(2, 2, [{}, {}, {}]) is None
    assert first_short(3, 2, [{"x": "down"}, {"x": "down"}]) is None
    assert first_short(2, 2, [{}, {"x": "down"}, {}, {"x": "down"}]) == 1


def test_recovery_closes_with_its_new_fragments_in_the_same_change():
    md = in_recovery([Fragment(0, ["a", "b", "c"]), Fragment(10, ["a", "b", "d"])])
    closed = close_recovered(50, 5000, [Fragment(40, ["a", "e", "d"])])(md)
    assert closed.state is LedgerState.CLOSED and closed.last_entry_id == 50 and closed.length == 5000
    assert closed.fragments == md.fragments + [Fragment(40, ["a", "e", "d"])]
    replaced = close_recovered(50, 5000, [Fragment(10, ["a", "e", "d"])])(md)  # from the fragment's start
    assert replaced.fragments == [Fragment(0, ["a", "b", "c"]), Fragment(10, ["a", "e", "d"])]


def test_recovery_batches_shrink_for_large_entries_and_start_with_one_entry_per_stripe():
    md = in_recovery([Fragment(0, ["a", "b", "c"])])
    assert next_batch_size(256, md, []) == 3
    assert next_batch_size(256, md, [b"x" * 1024] * 3) == 256
    assert next_batch_size(256, md, [b"x" * (1 << 20)] * 3) == 16
    assert next_batch_size(256, md, [b"x" * (64 << 20)]) == 1
