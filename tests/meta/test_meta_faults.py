"""Metadata under etcd outages and at scale: watches resume, calls fail bounded and recover,
sessions re-register, listing is paged."""
import asyncio

import pytest

from pybk.meta import BookieInfo, LedgerMetadata, Fragment, MetadataUnavailableError
from pybk.meta.etcd import op_put, prefix_end
from pybk.meta.ledgers import ledger_key_suffix
from pybk.meta.underreplication import Marker
from pybk.meta.watch import Watch


async def retry_until_ok(call, timeout=60.0):
    """Call until it succeeds (etcd coming back), re-raising the last error after timeout."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            return await call()
        except MetadataUnavailableError:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.2)


@pytest.mark.private_etcd
async def test_watch_open_across_etcd_stop_and_start_misses_no_event(etcd, open_store):
    watcher, writer = await open_store(), await open_store()
    seen: list[tuple[int, list[str]]] = []
    prefix = watcher.underreplication.dir
    stream = Watch(watcher.etcd, prefix, prefix_end(prefix))
    paused, go = asyncio.Event(), asyncio.Event()

    async def consume(n):
        async for ev in stream:
            marker = Marker.from_bytes(int(ev.key[len(prefix):]), ev.value)
            seen.append((marker.ledger_id, marker.missing))
            if len(seen) == 20:
                paused.set()
                await go.wait()  # not reading: what follows must come from etcd's history
            if len(seen) == n:
                return
    consumer = asyncio.create_task(consume(60))
    await asyncio.sleep(0.3)
    for i in range(1, 21):
        await writer.underreplication.mark(i, [f"b{i}"])
    await asyncio.wait_for(paused.wait(), 30)
    etcd.stop()
    await asyncio.sleep(1.0)
    etcd.start()
    for i in range(21, 41):
        await retry_until_ok(lambda i=i: writer.underreplication.mark(i, [f"b{i}"]))
    etcd.restart()
    for i in range(1, 21):
        await retry_until_ok(lambda i=i: writer.underreplication.mark(i, [f"c{i}"]))
    go.set()
    await asyncio.wait_for(consumer, 60)
    await stream.close()
    expected = [(i, [f"b{i}"]) for i in range(1, 41)] + [(i, [f"b{i}", f"c{i}"]) for i in range(1, 21)]
    assert seen == expected
    assert stream.reconnects >= 1


async def test_marker_watch_follows_changes(store):
    stream = store.underreplication.watch(initial=True)
    await store.underreplication.mark(1, ["b1"])
    first = await asyncio.wait_for(anext(stream), 30)
    await store.underreplication.mark(2, ["b2"])
    await store.underreplication.unmark(1)
    rest = [await asyncio.wait_for(anext(stream), 30) for _ in range(2)]
    await stream.aclose()
    assert [(first[0], first[1].missing)] + [(i, m.missing if m else None) for i, m in rest] == [
        (1, ["b1"]), (2, ["b2"]), (1, None)]


@pytest.mark.private_etcd
async def test_unreachable_etcd_fails_bounded_naming_endpoint_and_recovers(etcd, open_store):
    store = await open_store(timeout=1, lease_ttl=2)
    md = await store.ledgers.create(["b1", "b2"], 2, 2)
    await store.registry.register(BookieInfo("b1", "127.0.0.1:1"))
    lease_before = await store.session.lease_id()
    lock = await store.locks.acquire("underreplicated/9")
    etcd.stop()
    calls = [lambda: store.ledgers.get(md.ledger_id), lambda: store.ledgers.create(["b1"], 1, 1),
             lambda: store.ledgers.cas(md.replace(length=1)), lambda: store.registry.writable(),
             lambda: store.cluster.instance_id(), lambda: anext(store.ledgers.list())]
    for call in calls:
        with pytest.raises(MetadataUnavailableError) as err:
            await asyncio.wait_for(call(), 30)
        assert etcd.endpoint in str(err.value)
    await asyncio.wait_for(store.session.lost.wait(), 30)
    assert lock.lost.is_set() and not lock.held, "a lock dies with the session's lease"
    etcd.start()
    assert (await retry_until_ok(lambda: store.ledgers.get(md.ledger_id))) == md
    # The session replaced its lost lease and re-registered the bookie by itself.
    for _ in range(300):
        if not store.session.lost.is_set() and "b1" in await store.registry.writable():
            break
        await asyncio.sleep(0.1)
    assert not store.session.lost.is_set() and store.session.current != lease_before
    assert set(await store.registry.writable()) == {"b1"}
    relocked = await store.locks.try_acquire("underreplicated/9")
    assert relocked is not None and relocked.lease == store.session.current
    created = await store.ledgers.create(["b1"], 1, 1)
    assert (await store.ledgers.get(created.ledger_id)) == created


@pytest.mark.private_etcd
async def test_connect_to_unreachable_etcd_fails_naming_endpoint(etcd):
    from pybk.meta import MetadataStore
    uri = etcd.metadata_uri("pybk") + "?timeout=0.5"
    etcd.stop()
    with pytest.raises(MetadataUnavailableError, match=etcd.endpoint.replace(".", r"\.")):
        await asyncio.wait_for(MetadataStore.connect(uri), 30)


async def test_listing_100000_ledgers_is_paged_and_in_id_order(open_store):
    store = await open_store(timeout=60)  # bulk loading on a shared, loaded machine
    n, per_txn = 100_000, 125
    ids = list(range(1, 3 * n + 1, 3))
    template = LedgerMetadata(ledger_id=1, ensemble_size=3, write_quorum=2, ack_quorum=2,
                              fragments=[Fragment(0, ["b1", "b2", "b3"])])

    async def put_batch(batch):
        ops = [op_put(store.ledgers.dir + ledger_key_suffix(i), template.replace(ledger_id=i).to_bytes())
               for i in batch]
        await store.etcd.txn([], ops, what="bulk load")
    batches = [ids[i:i + per_txn] for i in range(0, n, per_txn)]
    sem = asyncio.Semaphore(4)

    async def guarded(batch):
        async with sem:
            await put_batch(batch)
    # Shuffled load order: the listing order must come from etcd's key order, not insertion order.
    await asyncio.gather(*(guarded(b) for b in reversed(batches)))
    assert await store.ledgers.count() == n

    page_size, pages, previous, total = 1000, 0, 0, 0
    async for page in store.ledgers.pages(page_size=page_size):
        assert 0 < len(page) <= page_size
        assert page == sorted(page) and page[0] > previous
        previous, total, pages = page[-1], total + len(page), pages + 1
    assert total == n and previous == ids[-1]
    assert n // page_size <= pages <= 4 * n // page_size + 64, "pages are neither oversized nor tiny"

    expected = iter(ids)
    count = 0
    async for ledger_id in store.ledgers.list(page_size=777):
        assert ledger_id == next(expected)
        count += 1
    assert count == n
    assert [m.ledger_id async for m in store.ledgers.list_metadata(start=ids[500], end=ids[510])] == ids[500:510]


async def test_read_only_transactions_are_refused_before_they_reach_etcd(store):
    # etcd 3.5.1 panics when a client cancels a read-only txn in flight (etcd-io/etcd#14110)
    from pybk.meta.etcd import op_get
    with pytest.raises(ValueError, match="reads only"):
        await store.etcd.txn([], [op_get(b"a"), op_get(b"b")], what="probe")
    with pytest.raises(ValueError, match="reads only"):
        await store.etcd.txn([], [], what="compares only")
    assert (await store.etcd.status()).header.revision >= 1  # etcd is still there
