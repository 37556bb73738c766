"""Ledger metadata: the model and its encoding (pure), and CAS, ids, listing on a real etcd."""
import asyncio
import base64
import json

import pytest

from pybk.entry import DigestType
from pybk.ledger import fragment_ranges
from pybk.meta import (BadMetadataError, Fragment, LedgerExistsError, LedgerMetadata, LedgerState,
                       NoSuchLedgerError, VersionConflictError)
from pybk.meta.ledgers import Unchanged


def sample() -> LedgerMetadata:
    return LedgerMetadata(ledger_id=(1 << 63) - 1, ensemble_size=3, write_quorum=2, ack_quorum=2,
                          state=LedgerState.CLOSED, last_entry_id=99, length=12345,
                          digest_type=DigestType.MAC, password_hash=b"\x01" * 32, ctime_ms=1_700_000_000_000,
                          custom={"app": b"spark", "bin": b"\x00\xff"},
                          fragments=[Fragment(0, ["a:1", "b:1", "c:1"]), Fragment(50, ["a:1", "d:1", "c:1"])],
                          version=7, key_check=b"\x03" * 32)


def test_metadata_round_trips_through_protobuf_and_json():
    md = sample()
    assert LedgerMetadata.from_bytes(md.to_bytes(), version=7) == md
    assert LedgerMetadata.from_json(md.to_json()) == md.replace(key_check=b"")
    legacy = md.replace(key_check=b"", master_key=b"\x02" * 32)  # as stored by earlier releases
    assert LedgerMetadata.from_bytes(legacy.to_bytes(), version=7).master_key == b"\x02" * 32
    assert md.to_json()["password_hash"] == "01" * 32
    assert len(md.to_bytes()) < 200


def test_json_view_and_repr_show_neither_the_key_check_nor_a_legacy_master_key():
    md = sample().replace(master_key=b"\x02" * 32)
    view = json.dumps(md.to_json())
    for secret in (md.key_check, md.master_key):
        assert secret.hex() not in view and base64.b64encode(secret).decode() not in view
        assert secret.hex() not in repr(md)
    assert "master_key" not in md.to_json() and "key_check" not in md.to_json()


def test_ensemble_and_write_set_follow_fragments():
    md = sample()
    assert md.ensemble_for(0) == md.ensemble_for(49) == ["a:1", "b:1", "c:1"]
    assert md.ensemble_for(50) == md.ensemble_for(10**9) == ["a:1", "d:1", "c:1"]
    assert md.write_set(2) == ["c:1", "a:1"] and md.write_set(52) == ["d:1", "c:1"]
    assert fragment_ranges(md.fragments, md.last_entry_id) == [(0, 49), (50, 99)]
    assert md.bookies() == {"a:1", "b:1", "c:1", "d:1"}


@pytest.mark.parametrize("change, says", [
    (dict(write_quorum=4), "ensemble size >= write quorum"),
    (dict(ack_quorum=0), "ack quorum >= 1"),
    (dict(ledger_id=0), "positive 63-bit"),
    (dict(fragments=[]), "at least one fragment"),
    (dict(fragments=[Fragment(0, ["a", "a", "b"])]), "twice"),
    (dict(fragments=[Fragment(0, ["a", "b"])]), "has 2 bookies"),
    (dict(fragments=[Fragment(1, ["a", "b", "c"])]), "start at entry 0"),
    (dict(custom={"k": "text"}), "str to bytes"),
])
def test_invalid_metadata_is_refused(change, says):
    with pytest.raises(BadMetadataError) as err:
        sample().replace(**change).validate()
    assert says in str(err.value)


def test_garbage_is_not_decoded_as_metadata():
    with pytest.raises(BadMetadataError):
        LedgerMetadata.from_bytes(b"\xff\xff\xff", ledger_id=3)


async def test_create_get_delete(store):
    md = await store.ledgers.create(["a", "b", "c"], 2, 2, password_hash=b"h", custom={"x": b"1"},
                                    key_check=b"k" * 32)
    assert md.ledger_id > 0 and md.version > 0 and md.state is LedgerState.OPEN and md.last_entry_id == -1
    got = await store.ledgers.get(md.ledger_id)
    assert got == md and got.custom == {"x": b"1"} and got.key_check == b"k" * 32 and got.master_key == b""
    with pytest.raises(LedgerExistsError):
        await store.ledgers.create(["a", "b", "c"], 2, 2, ledger_id=md.ledger_id)
    with pytest.raises(VersionConflictError):
        await store.ledgers.delete(md.ledger_id, version=md.version - 1)
    await store.ledgers.delete(md.ledger_id, version=md.version)
    with pytest.raises(NoSuchLedgerError):
        await store.ledgers.get(md.ledger_id)
    with pytest.raises(NoSuchLedgerError):
        await store.ledgers.delete(md.ledger_id)
    with pytest.raises(NoSuchLedgerError):
        await store.ledgers.cas(md)


async def test_two_concurrent_updaters_cas_exactly_one_wins_and_loser_sees_winner(open_store):
    a, b = await open_store(), await open_store()
    md = await a.ledgers.create(["b1", "b2", "b3"], 3, 2)
    seen = {"a": await a.ledgers.get(md.ledger_id), "b": await b.ledgers.get(md.ledger_id)}
    for round_no in range(20):
        stores = {"a": a, "b": b}
        mine = {n: seen[n].replace(length=seen[n].length + 1,
                                   custom={**seen[n].custom, "writer": n.encode(), "round": b"%d" % round_no})
                for n in stores}
        results = await asyncio.gather(*(stores[n].ledgers.cas(mine[n]) for n in stores), return_exceptions=True)
        outcome = dict(zip(stores, results))
        winners = [n for n, r in outcome.items() if isinstance(r, LedgerMetadata)]
        losers = [n for n, r in outcome.items() if isinstance(r, VersionConflictError)]
        assert len(winners) == 1 and len(losers) == 1, outcome
        won, lost = outcome[winners[0]], outcome[losers[0]]
        assert lost.current == won
        reread = await stores[losers[0]].ledgers.get(md.ledger_id)
        assert reread == won and reread.custom["writer"] == winners[0].encode()
        assert reread.length == round_no + 1
        seen = {"a": reread, "b": reread}


async def test_update_reads_changes_and_stores_when_nobody_interferes(store):
    md = await store.ledgers.create(["b1", "b2", "b3"], 3, 2)
    seen = []

    def change(current):
        seen.append(current)
        return current.replace(length=current.length + 10)

    result = await store.ledgers.update(md.ledger_id, change)
    assert result.written and result.reason is None
    assert seen == [md]                                    # read once, asked once
    assert result.metadata == await store.ledgers.get(md.ledger_id)
    assert result.metadata.length == 10 and result.metadata.version > md.version


async def test_update_rereads_after_a_conflict_and_asks_change_again_about_the_winner(open_store):
    mine, other = await open_store(), await open_store()
    md = await mine.ledgers.create(["b1", "b2", "b3"], 3, 2)
    winner = await other.ledgers.cas(md.replace(custom={"by": b"other"}))
    seen = []

    def change(current):
        seen.append(current)
        return current.replace(length=current.length + 1)

    result = await mine.ledgers.update(md.ledger_id, change, current=md)   # a stale copy
    assert seen == [md, winner]
    assert result.written
    stored = await mine.ledgers.get(md.ledger_id)
    assert stored == result.metadata
    assert stored.custom == {"by": b"other"} and stored.length == 1      # the winner's change is kept


async def test_update_gives_up_with_change_reason_and_writes_nothing(open_store):
    mine, other = await open_store(), await open_store()
    md = await mine.ledgers.create(["b1", "b2", "b3"], 3, 2)
    closed = await other.ledgers.cas(md.replace(state=LedgerState.CLOSED, last_entry_id=4))

    def change(current):
        if current.state is not LedgerState.OPEN:
            return Unchanged(current.state)
        return current.replace(length=1)

    result = await mine.ledgers.update(md.ledger_id, change, current=md)
    assert not result.written and result.reason is LedgerState.CLOSED
    assert result.metadata == closed == await mine.ledgers.get(md.ledger_id)


async def test_update_lets_change_errors_and_a_deleted_ledger_through(store):
    md = await store.ledgers.create(["b1", "b2", "b3"], 3, 2)

    def refuse(current):
        raise ValueError("no")

    with pytest.raises(ValueError):
        await store.ledgers.update(md.ledger_id, refuse)
    assert await store.ledgers.get(md.ledger_id) == md
    await store.ledgers.delete(md.ledger_id)
    with pytest.raises(NoSuchLedgerError):
        await store.ledgers.update(md.ledger_id, lambda current: current.replace(length=1))
    with pytest.raises(NoSuchLedgerError):
        await store.ledgers.update(md.ledger_id, lambda current: current.replace(length=1), current=md)


async def test_four_concurrent_allocators_take_10000_unique_positive_63bit_ids(etcd):
    from pybk.meta import MetadataStore
    stores = [await MetadataStore.connect(etcd.metadata_uri("pybk"), id_block=50) for _ in range(4)]
    try:
        async def take(store, n):
            return [await store.ledgers.allocate_id() for _ in range(n)]
        batches = await asyncio.gather(*(take(s, 2500) for s in stores))
    finally:
        for s in stores:
            await s.close()
    ids = [i for batch in batches for i in batch]
    assert len(ids) == 10_000 and len(set(ids)) == 10_000
    assert all(0 < i < (1 << 63) for i in ids)
    assert all(len(batch) == 2500 for batch in batches)


async def test_ids_allocated_by_create_are_unique_across_stores(open_store):
    a, b = await open_store(), await open_store()
    made = await asyncio.gather(*(s.ledgers.create(["x"], 1, 1) for s in (a, b) for _ in range(20)))
    ids = [m.ledger_id for m in made]
    assert len(set(ids)) == 40
    assert [i async for i in a.ledgers.list()] == sorted(ids)
    assert await a.ledgers.count() == 40


async def test_list_range_and_metadata(store):
    top = (1 << 63) - 1
    for lid in (5, 7, 1000, 12, top, 10**15):
        await store.ledgers.create(["x", "y"], 2, 1, ledger_id=lid)
    assert [i async for i in store.ledgers.list(page_size=2)] == [5, 7, 12, 1000, 10**15, top]
    assert [i async for i in store.ledgers.list(start=6, end=1000, page_size=1)] == [7, 12]
    assert [m.ledger_id async for m in store.ledgers.list_metadata(page_size=3)] == [5, 7, 12, 1000, 10**15, top]


async def test_watch_one_ledger_sees_each_change_then_deletion(store):
    md = await store.ledgers.create(["x"], 1, 1)
    watch = store.ledgers.watch(md.ledger_id)
    seen = []

    async def consume():
        async for m in watch:
            seen.append(m)
            if m is None:
                return
    task = asyncio.create_task(consume())
    await asyncio.sleep(0.2)
    md = await store.ledgers.cas(md.replace(state=LedgerState.IN_RECOVERY))
    md = await store.ledgers.cas(md.replace(state=LedgerState.CLOSED, last_entry_id=3))
    await store.ledgers.delete(md.ledger_id)
    await asyncio.wait_for(task, 30)
    await watch.close()
    assert [m.state if m else None for m in seen] == [LedgerState.IN_RECOVERY, LedgerState.CLOSED, None]
    assert seen[1] == md
