"""Locks, leader election, under-replication markers and decommission records on a real etcd."""
import asyncio
import sys
from pathlib import Path

import pytest

from pybk.local.process import ChildProcess
from pybk.meta import VersionConflictError

from polling import eventually

HOLDER = Path(__file__).with_name("meta_holder.py")


def start_holder(tmp_path, uri: str, what: str, name: str, value: str) -> ChildProcess:
    log = tmp_path / f"holder-{value}.log"
    proc = ChildProcess(f"holder {value}", [sys.executable, str(HOLDER), uri, what, name, value], log)
    proc.start()
    word = "HELD" if what == "lock" else "LEADING"
    proc.wait_ready(lambda: word in log.read_text(), 60)
    return proc


async def test_lock_of_killed_process_goes_to_waiter_and_killed_leader_is_replaced(etcd, open_store, tmp_path):
    ttl = 2
    uri = etcd.metadata_uri("pybk") + f"?lease_ttl={ttl}"
    store = await open_store(lease_ttl=ttl)
    holder = start_holder(tmp_path, uri, "lock", "underreplicated/42", "killed-worker")
    leader = start_holder(tmp_path, uri, "lead", "auditor", "killed-auditor")
    try:
        assert await store.locks.try_acquire("underreplicated/42") is None
        assert (await store.locks.holder("underreplicated/42"))[0] == b"killed-worker"
        assert await store.election.leader() == "killed-auditor"
        waiter = asyncio.create_task(store.locks.acquire("underreplicated/42", b"waiter"))
        candidate = asyncio.create_task(store.election.campaign("standby-auditor"))
        await asyncio.sleep(0.5)
        assert not waiter.done() and not candidate.done()
        holder.kill()
        leader.kill()
        lock = await asyncio.wait_for(waiter, ttl + 30)
        leadership = await asyncio.wait_for(candidate, ttl + 30)
        assert lock.held and (await store.locks.holder("underreplicated/42"))[0] == b"waiter"
        assert leadership.held and await store.election.leader() == "standby-auditor"
        await lock.release()
        assert await store.locks.holder("underreplicated/42") is None
        await leadership.resign()
        assert await store.election.leader() is None
    finally:
        holder.kill()
        leader.kill()


async def test_lock_is_exclusive_and_fifo(open_store):
    a, b, c = await open_store(), await open_store(), await open_store()
    first = await a.locks.acquire("underreplicated/1")
    assert await a.locks.try_acquire("underreplicated/1") is None, "one holder per process too"
    assert await b.locks.try_acquire("underreplicated/1") is None
    order = []

    async def take(store, who):
        lock = await store.locks.acquire("underreplicated/1", who.encode())
        order.append(who)
        await lock.release()
    tb = asyncio.create_task(take(b, "b"))
    await asyncio.sleep(0.3)
    tc = asyncio.create_task(take(c, "c"))
    await asyncio.sleep(0.3)
    assert order == []
    await first.release()
    await asyncio.wait_for(asyncio.gather(tb, tc), 30)
    assert order == ["b", "c"]
    assert await b.locks.try_acquire("underreplicated/2") is not None


async def test_leader_is_observed_changing(open_store):
    a, b = await open_store(), await open_store()
    seen = []
    obs = b.election.observe()

    async def watch():
        async for leader in obs:
            seen.append(leader)
            if len(seen) == 3:
                return
    task = asyncio.create_task(watch())
    # campaign only once the observer has told the current state (no leader): it watches from there
    await eventually(lambda: seen == [None], timeout=30, what="the observer's first answer")
    lead = await a.election.campaign("a")
    await eventually(lambda: seen == [None, "a"], timeout=30, what="the observer to see the leader")
    await lead.release()
    await asyncio.wait_for(task, 30)
    await obs.aclose()
    assert seen == [None, "a", None]


async def test_underreplication_markers_merge_and_unmark_by_cas(store):
    m = await store.underreplication.mark(7, ["b1"])
    m2 = await store.underreplication.mark(7, ["b2", "b1"])
    assert m2.missing == ["b1", "b2"] and m2.since_ms == m.since_ms
    await store.underreplication.mark(3, ["b9"])
    assert [x.ledger_id async for x in store.underreplication.list(page_size=1)] == [3, 7]
    assert await store.underreplication.count() == 2
    with pytest.raises(VersionConflictError):
        await store.underreplication.unmark(7, version=m.version)
    assert await store.underreplication.unmark(7, version=m2.version)
    assert await store.underreplication.get(7) is None
    assert not await store.underreplication.unmark(7)


async def test_decommission_request_and_progress(store):
    req = await store.decommission.request("b1")
    assert (await store.decommission.request("b1")) == req
    rec = await store.decommission.update(req, state="draining", ledgers_total=10, ledgers_remaining=4)
    with pytest.raises(VersionConflictError):
        await store.decommission.update(req, state="done")
    assert (await store.decommission.get("b1")).ledgers_remaining == 4
    assert list(await store.decommission.list()) == ["b1"]
    rec = await store.decommission.update(rec, state="done", ledgers_remaining=0)
    assert await store.decommission.remove("b1")
    assert await store.decommission.get("b1") is None
