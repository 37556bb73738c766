"""Watches that were disconnected across an etcd compaction catch up by re-reading, never fail."""
from __future__ import annotations

import asyncio
import logging

import pytest

# etcd compaction is global: these tests compact and restart an etcd of their own
pytestmark = pytest.mark.private_etcd



async def compact_while_disconnected(etcd, store, changes) -> None:
    """Restart etcd (every watch stream breaks), apply `changes`, then compact away the history a
    resumed watch would need."""
    etcd.stop()
    etcd.start()
    await changes()
    now = (await store.etcd.status()).header.revision
    await store.etcd.put(store.prefix + b"filler", b"x")
    await store.etcd.compact(now + 1)


async def test_marker_watch_catches_up_after_its_history_was_compacted(etcd, open_store, caplog):
    observer, writer = await open_store(), await open_store()
    for ledger in (1, 2, 3):
        await writer.underreplication.mark(ledger, [f"b{ledger}"])
    stream = observer.underreplication.watch(initial=True)
    view = {}
    for _ in range(3):
        ledger, marker = await asyncio.wait_for(anext(stream), 30)
        view[ledger] = marker.missing

    async def changes():
        await writer.underreplication.unmark(1)
        await writer.underreplication.mark(2, ["c2"])
        await writer.underreplication.mark(4, ["b4"])

    caplog.set_level(logging.INFO, logger="pybk.meta.watch")
    await compact_while_disconnected(etcd, writer, changes)
    expected = {2: ["b2", "c2"], 3: ["b3"], 4: ["b4"]}
    while view != expected:
        ledger, marker = await asyncio.wait_for(anext(stream), 60)
        if marker is None:
            view.pop(ledger, None)
        else:
            view[ledger] = marker.missing
    await stream.aclose()
    assert "lost its history to compaction" in caplog.text


async def test_ledger_watch_catches_up_after_its_history_was_compacted(etcd, open_store, caplog):
    observer, writer = await open_store(), await open_store()
    md = await writer.ledgers.create(["b1", "b2", "b3"], 3, 2)
    watch = observer.ledgers.watch(md.ledger_id, start_revision=md.version + 1)
    first = await writer.ledgers.cas(md.replace(custom={"step": b"1"}))
    assert (await asyncio.wait_for(anext(watch), 30)).custom == {"step": b"1"}

    async def changes():
        await writer.ledgers.cas(first.replace(custom={"step": b"2"}))

    caplog.set_level(logging.INFO, logger="pybk.meta.ledgers")
    await compact_while_disconnected(etcd, writer, changes)
    seen = await asyncio.wait_for(anext(watch), 60)
    await watch.close()
    assert seen.custom == {"step": b"2"}
    assert "lost its history to compaction" in caplog.text
