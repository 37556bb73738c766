"""Bookie registry, session lease, cluster instance id and cookies on a real etcd."""
import asyncio

import pytest

from pybk.meta import BookieIdInUseError, BookieInfo, Cookie, CookieMismatchError
from pybk.meta.cookies import NEW, OK, check


def info(n: int, **kw) -> BookieInfo:
    return BookieInfo(f"bookie-{n}", f"127.0.0.1:{4000 + n}", f"127.0.0.1:{5000 + n}", **kw)


async def test_register_set_readonly_unregister_and_watch(open_store):
    observer, bookie = await open_store(), await open_store()
    watch = observer.registry.watch(initial=True)
    await bookie.registry.register(info(1, zone="z1", rack="r1", version="0.1.0"))
    events = []

    async def collect(n):
        async for ev in watch:
            events.append((ev.bookie_id, ev.state))
            if len(events) == n:
                return
    task = asyncio.create_task(collect(5))
    await asyncio.sleep(0.2)
    await bookie.registry.register(info(2))
    assert set(await observer.registry.writable()) == {"bookie-1", "bookie-2"}
    assert (await observer.registry.writable())["bookie-1"] == info(1, zone="z1", rack="r1", version="0.1.0")
    await bookie.registry.set_readonly("bookie-1", True)
    assert set(await observer.registry.writable()) == {"bookie-2"}
    assert set(await observer.registry.readonly()) == {"bookie-1"}
    await bookie.registry.set_readonly("bookie-1", False)
    await bookie.registry.unregister("bookie-2")
    await asyncio.wait_for(task, 30)
    await watch.close()
    assert events == [("bookie-1", "writable"), ("bookie-2", "writable"), ("bookie-1", "readonly"),
                      ("bookie-1", "writable"), ("bookie-2", "gone")]
    assert await observer.registry.all() == {"bookie-1": ("writable", info(1, zone="z1", rack="r1",
                                                                           version="0.1.0"))}


async def test_same_bookie_id_from_another_live_process_is_refused(open_store):
    a, b = await open_store(), await open_store()
    await a.registry.register(info(1))
    with pytest.raises(BookieIdInUseError):
        await b.registry.register(info(1), wait=0.5)
    waiting = asyncio.create_task(b.registry.register(info(1)))
    await asyncio.sleep(0.3)
    await a.close()
    await asyncio.wait_for(waiting, 30)
    assert set(await b.registry.writable()) == {"bookie-1"}


async def test_closing_the_store_removes_its_registrations_at_once(open_store):
    a, b = await open_store(lease_ttl=60), await open_store()
    await a.registry.register(info(1))
    await a.registry.register(info(2), readonly=True)
    await a.close()
    assert await b.registry.all() == {}


async def test_two_first_bookies_agree_on_one_instance_id(open_store):
    stores = [await open_store() for _ in range(4)]
    assert await stores[0].cluster.instance_id(create=False) is None
    ids = await asyncio.gather(*(s.cluster.instance_id() for s in stores))
    assert len(set(ids)) == 1 and ids[0]
    assert (await stores[0].cluster.get())["layout_version"] == 1


def cookie(**kw) -> Cookie:
    base = dict(instance_id="i-1", bookie_id="b1", journal_dir="/j", ledger_dirs=("/l1", "/l2"))
    return Cookie(**{**base, **kw})


def test_cookie_check_decisions():
    exp = cookie()
    assert check(exp, None, {"/j": None, "/l1": None}) == NEW
    assert check(exp, cookie(), {"/j": cookie(), "/l1": cookie()}) == OK
    with pytest.raises(CookieMismatchError, match="instance_id: expected 'i-1', found 'i-2'"):
        check(exp, cookie(instance_id="i-2"), {"/j": cookie()})
    with pytest.raises(CookieMismatchError, match=r"directories \['/l1'\] have no cookie"):
        check(exp, cookie(), {"/j": cookie(), "/l1": None})
    with pytest.raises(CookieMismatchError, match="etcd has none"):
        check(exp, None, {"/j": cookie()})
    with pytest.raises(CookieMismatchError, match="ledger_dirs"):
        check(exp, cookie(), {"/j": cookie(ledger_dirs=("/l2", "/l1"))})


async def test_cookie_verify_stamps_new_bookie_then_accepts_and_refuses(store, tmp_path):
    dirs = [tmp_path / "j", tmp_path / "l"]
    for d in dirs:
        d.mkdir()
    exp = cookie(journal_dir=str(dirs[0]), ledger_dirs=(str(dirs[1]),),
                 instance_id=await store.cluster.instance_id())
    assert await store.cookies.verify(exp) == NEW
    assert Cookie.read_dir(dirs[1]) == exp and (await store.cookies.get("b1")) == exp
    assert await store.cookies.verify(exp) == OK
    with pytest.raises(CookieMismatchError, match="bookie_id"):
        await store.cookies.verify(cookie(bookie_id="b2", journal_dir=str(dirs[0]), ledger_dirs=(str(dirs[1]),),
                                          instance_id=exp.instance_id))
    (dirs[1] / "COOKIE").unlink()
    with pytest.raises(CookieMismatchError, match="have no cookie"):
        await store.cookies.verify(exp)
    assert await store.cookies.delete("b1")
    assert list(await store.cookies.list()) == []


@pytest.mark.private_etcd
async def test_registry_watch_catches_up_after_its_history_was_compacted(etcd, open_store):
    observer, bookie = await open_store(), await open_store()
    await bookie.registry.register(info(1))
    await bookie.registry.register(info(2))
    watch = observer.registry.watch(initial=True)
    assert {(await anext(watch)).bookie_id for _ in range(2)} == {"bookie-1", "bookie-2"}
    etcd.stop()
    etcd.start()
    # While the watcher is disconnected: changes, then compaction of the history it would need.
    await bookie.registry.unregister("bookie-1")
    await bookie.registry.set_readonly("bookie-2", True)
    await bookie.registry.register(info(3))
    now = (await bookie.etcd.status()).header.revision
    await bookie.etcd.put(bookie.prefix + b"filler", b"x")
    await bookie.etcd.compact(now + 1)
    events, revisions = {}, set()
    while len(events) < 3:
        ev = await asyncio.wait_for(anext(watch), 60)
        events[ev.bookie_id] = ev.state
        revisions.add(ev.revision)
    await watch.close()
    assert events == {"bookie-1": "gone", "bookie-2": "readonly", "bookie-3": "writable"}
    assert len(revisions) == 1, "the changes were recovered by one re-read, not replayed from history"


async def test_several_endpoints_work_when_one_is_down(etcd):
    from pybk.local.process import free_port
    from pybk.meta import MetadataStore
    uri = f"etcd://127.0.0.1:{free_port()},localhost:{etcd.client_port}/pybk?timeout=5"
    async with await MetadataStore.connect(uri) as store:
        md = await store.ledgers.create(["a"], 1, 1)
        assert (await store.ledgers.get(md.ledger_id)) == md
        await store.registry.register(info(1))
        assert set(await store.registry.writable()) == {"bookie-1"}


async def test_session_keeps_its_lease_alive_well_past_its_ttl(open_store):
    bookie, observer = await open_store(lease_ttl=3), await open_store()
    await bookie.registry.register(info(1))
    lease = bookie.session.current
    await asyncio.sleep(7)
    assert bookie.session.current == lease and not bookie.session.lost.is_set()
    assert set(await observer.registry.writable()) == {"bookie-1"}
    assert (await observer.etcd.get(observer.registry.key("writable", "bookie-1"))).lease == lease


@pytest.mark.private_etcd
async def test_a_quick_etcd_restart_keeps_the_session_and_its_registration(etcd, open_store):
    bookie = await open_store(lease_ttl=5)
    await bookie.registry.register(info(1))
    lease = bookie.session.current
    etcd.restart()
    await asyncio.sleep(6)  # longer than the TTL: only keepalives on the new connection keep it
    assert bookie.session.current == lease and not bookie.session.lost.is_set()
    observer = await open_store()
    assert set(await observer.registry.writable()) == {"bookie-1"}
