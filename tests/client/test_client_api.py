"""The client API around the protocol: typed errors that say what happened, ledger listing and
deletion, custom metadata, MAC digests, zone-aware placement and the synchronous facade."""
from __future__ import annotations

import asyncio

import pytest
from client_helpers import expected, payload, read_all
from polling import eventually

from pybk.client import (BKError, BookKeeper, DigestType, InvalidLedgerConfigError, LedgerClosedError,
                         NoSuchEntryError, NoSuchLedgerError, NotEnoughBookiesError, UnauthorizedError)
from pybk.client import sync
from pybk.meta import LedgerState


async def test_errors_are_typed_and_say_what_happened(cluster_factory):
    cluster = cluster_factory(3)
    async with await BookKeeper.connect(cluster.uri) as bk:
        with pytest.raises(NotEnoughBookiesError, match="needed 4, found 3") as ei:
            await bk.create_ledger(ensemble=4, write_quorum=3, ack_quorum=2)
        assert (ei.value.needed, ei.value.found) == (4, 3)
        with pytest.raises(InvalidLedgerConfigError, match="E=2 Qw=3"):
            await bk.create_ledger(ensemble=2, write_quorum=3, ack_quorum=2)
        with pytest.raises(NoSuchLedgerError, match="ledger 424242 does not exist"):
            await bk.open_ledger(424242, password=b"pw")
        lh = await bk.create_ledger(3, 2, 2, password=b"right")
        await lh.add_entry(b"x")
        with pytest.raises(UnauthorizedError, match=f"wrong password for ledger {lh.ledger_id}"):
            await bk.open_ledger(lh.ledger_id, password=b"wrong")
        with pytest.raises(NoSuchEntryError, match="last add confirmed is 0"):
            [e async for e in lh.read_entries(0, 5)]
        await lh.close()
        with pytest.raises(LedgerClosedError, match="is closed"):
            await lh.add_entry(b"y")
        big = await bk.create_ledger(3, 3, 2, password=b"right")
        with pytest.raises(BKError, match="bad request"):           # over the bookies' max entry size
            await big.add_entry(b"x" * (6 << 20))
        assert len(big.metadata.fragments) == 1                      # no bookie was blamed for it
        rh = await bk.open_ledger(lh.ledger_id, password=b"right")
        with pytest.raises(LedgerClosedError, match="reading only"):
            await rh.add_entry(b"y")
        with pytest.raises(NoSuchEntryError, match="last entry is 0"):
            [e async for e in rh.read_entries(0, 1)]


async def test_too_few_writable_bookies_for_a_new_ledger_names_the_read_only_ones(cluster_factory):
    cluster = cluster_factory(3)
    held = cluster.bookies[0]
    await asyncio.to_thread(held.http_json, "/api/v1/bookie/state/readonly", "PUT", {"readOnly": True})
    async with await BookKeeper.connect(cluster.uri) as bk:
        async def two_writable():
            return len(await bk.writable_bookies()) == 2
        await eventually(two_writable, what="the held bookie registered read-only")
        with pytest.raises(NotEnoughBookiesError, match=r"needed 3, found 2 \(1 more registered read-only") as ei:
            await bk.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2)
        assert (ei.value.needed, ei.value.found) == (3, 2)
        await asyncio.to_thread(held.http_json, "/api/v1/bookie/state/readonly", "PUT", {"readOnly": False})
        lh = await eventually(lambda: _create_or_none(bk), what="a ledger once the bookie is writable again")
        assert len(lh.metadata.fragments[0].bookies) == 3


async def _create_or_none(bk: BookKeeper):
    try:
        return await bk.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2)
    except NotEnoughBookiesError:
        return None


async def test_ledgers_list_delete_and_keep_custom_metadata_and_mac_digests(cluster_factory):
    cluster = cluster_factory(3)
    async with await BookKeeper.connect(cluster.uri) as bk:
        a = await bk.create_ledger(3, 3, 2, digest=DigestType.MAC, password=b"pw", metadata={"app": b"x"})
        b = await bk.create_ledger(2, 2, 1, password=b"pw")
        await asyncio.gather(*(a.add_entry_async(payload(a.ledger_id, i)) for i in range(50)))
        await a.close()
        await b.close()
        assert [lid async for lid in bk.list_ledgers()] == sorted([a.ledger_id, b.ledger_id])
        md = await bk.ledger_metadata(a.ledger_id)
        assert (md.state, md.last_entry_id, md.custom, md.digest_type) == (
            LedgerState.CLOSED, 49, {"app": b"x"}, DigestType.MAC)
        assert md.length == sum(len(payload(a.ledger_id, i)) for i in range(50))
        rh = await bk.open_ledger(a.ledger_id, password=b"pw")
        assert await read_all(rh) == expected(a.ledger_id, 49)
        assert b.metadata.last_entry_id == -1
        await bk.delete_ledger(b.ledger_id, b"pw")
        assert [lid async for lid in bk.list_ledgers()] == [a.ledger_id]
        with pytest.raises(NoSuchLedgerError):
            await bk.delete_ledger(b.ledger_id, b"pw")


async def test_placement_spreads_ensembles_across_zones(cluster_factory):
    cluster = cluster_factory(2, zone="a")
    cluster.add(2, zone="b", registration_ttl=2)
    cluster.add(2, zone="c", registration_ttl=2)
    zone = {b.bookie_id: z for b, z in zip(cluster.bookies, "aabbcc")}
    async with await BookKeeper.connect(cluster.uri) as bk:
        for _ in range(5):
            lh = await bk.create_ledger(3, 3, 2)
            assert sorted(zone[b] for b in lh.metadata.fragments[0].bookies) == ["a", "b", "c"]
            await lh.close()


def test_sync_facade_writes_and_reads_without_asyncio(cluster_factory):
    cluster = cluster_factory(3)
    with sync.BookKeeper.connect(cluster.uri) as bk:
        lh = bk.create_ledger(3, 3, 2, password=b"pw")
        assert lh.add_entry(payload(lh.ledger_id, 0)) == 0
        assert lh.add_entries([payload(lh.ledger_id, i) for i in range(1, 100)]) == list(range(1, 100))
        lh.close()
        rh = bk.open_ledger(lh.ledger_id, password=b"pw")
        assert [(e.entry_id, e.data) for e in rh.read_entries(0, 99)] == expected(lh.ledger_id, 99)
        assert list(bk.list_ledgers()) == [lh.ledger_id]
        assert bk.ledger_metadata(lh.ledger_id).last_entry_id == 99
