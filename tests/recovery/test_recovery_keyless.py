"""Autorecovery repairs ledgers whose password it was never given and whose metadata holds no
master key, with keyless recovery (its admin role; everyone's in open mode) (real etcd, real
bookie and autorecovery processes)."""
from __future__ import annotations

import asyncio
import json
import os

from pybk import entry
from pybk.client import BookKeeper
from pybk.entry import DigestType
from pybk.meta import MetadataStore

from recovery_checks import assert_fully_replicated, eventually, every_copy_written

SECRET = b"secret"


async def _repaired(store, dead: str, ledger_ids) -> bool:
    if await store.underreplication.count():
        return False
    for lid in ledger_ids:
        md = await store.ledgers.get(lid)
        if dead in md.bookies() or not md.is_closed:
            return False
    return True


async def test_ledgers_with_an_unconfigured_password_and_no_stored_key_are_rereplicated(bookies, short_lease_uri, autorecovery):
    procs = bookies(4, metadata_uri=short_lease_uri, registration_ttl=2)
    store = await MetadataStore.connect(short_lease_uri)
    writer = await BookKeeper.connect(short_lease_uri)
    writer_gone = False
    try:
        written: dict[int, list[bytes]] = {}
        closed = await writer.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2, digest=DigestType.MAC,
                                            password=SECRET)
        written[closed.ledger_id] = [os.urandom(300) for _ in range(60)]
        await asyncio.gather(*(closed.add_entry_async(p) for p in written[closed.ledger_id]))
        await closed.close()
        opened = await writer.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2, digest=DigestType.MAC,
                                            password=SECRET)
        written[opened.ledger_id] = [os.urandom(300) for _ in range(40)]
        await asyncio.gather(*(opened.add_entry_async(p) for p in written[opened.ledger_id]))
        addresses = {p.bookie_id: p.address for p in procs}
        await eventually(lambda: every_copy_written(store, addresses, written), 10, what="every copy written")
        await writer.close()  # the writer is gone; its ledger stays OPEN
        writer_gone = True

        md = await store.ledgers.get(opened.ledger_id)
        assert md.master_key == b"" and md.state.name == "OPEN"
        assert md.key_check == entry.key_check(entry.master_key(SECRET))
        # a bookie of both ensembles (two 3-of-4 ensembles share at least two)
        shared = set(md.current_ensemble) & set((await store.ledgers.get(closed.ledger_id)).current_ensemble)
        victim = next(p for p in procs if p.bookie_id in shared)
        autorecovery(ledger_password=None)  # knows only the empty password
        victim.kill()
        await eventually(lambda: _repaired(store, victim.bookie_id, written), 180,
                         what=f"both ledgers closed and off {victim.bookie_id}")
        assert (await store.ledgers.get(opened.ledger_id)).last_entry_id == len(written[opened.ledger_id]) - 1
        alive = {p.bookie_id: p.address for p in procs if p is not victim}
        # every entry on exactly its write set, MAC-verified with the password by this test
        await assert_fully_replicated(store, alive, written, password=SECRET)
    finally:
        if not writer_gone:
            await writer.close()
        await store.close()


async def test_the_metadata_holds_no_master_key_and_the_admin_api_shows_no_key(bookies, short_lease_uri):
    procs = bookies(3, metadata_uri=short_lease_uri)
    async with await BookKeeper.connect(short_lease_uri) as bk:
        lh = await bk.create_ledger(ensemble=3, password=SECRET)
        await lh.close()
    key = entry.master_key(SECRET)
    async with await MetadataStore.connect(short_lease_uri) as store:
        stored = await store.etcd.get(store.ledgers.key(lh.ledger_id))
    assert stored is not None and key not in stored.value
    assert entry.key_check(key) in stored.value  # what bookies verify the key with, one-way
    body = procs[0].http_json(f"/api/v1/ledger/metadata?ledger_id={lh.ledger_id}")
    assert body["ledger_id"] == lh.ledger_id and "master_key" not in body and "key_check" not in body
    assert key.hex() not in json.dumps(body)
