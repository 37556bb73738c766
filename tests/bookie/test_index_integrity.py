"""A lost, cut or damaged LMDB index is noticed at start (the bookie refuses, naming data.mdb
and the rebuild command) and `pybk bookie --rebuild-index` restores every acknowledged entry
from the entry logs and the journal. Real bookie processes on real files."""
from __future__ import annotations

import asyncio
import json
import random
import subprocess

import pytest

from pybk import entry
from pybk.client.bookie_client import BookieClient
from pybk.bookie.index import DATA_FILE, required_size

KEY = entry.master_key(b"index")
LEDGERS = (11, 12)
ENTRIES = 1000


def body(ledger: int, eid: int) -> bytes:
    return entry.encode(ledger, eid, eid - 1, random.Random(ledger * 104729 + eid).randbytes(200))


def run_cli(bk, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(bk._argv() + list(extra), capture_output=True, text=True, timeout=300)


def damage(path, how: str) -> None:
    if how == "deleted":
        path.unlink()
    elif how == "truncated-to-0":
        path.write_bytes(b"")
    elif how == "truncated-to-60000":
        with open(path, "r+b") as f:
            f.truncate(60_000)
    else:  # every other page past the two meta pages overwritten with random bytes
        rnd = random.Random(1)
        psize = 4096
        pages = required_size(path.read_bytes()[:2 * psize]) // psize
        with open(path, "r+b") as f:
            for page in range(2, pages, 2):
                f.seek(page * psize)
                f.write(rnd.randbytes(psize))


@pytest.mark.parametrize("how", ["deleted", "truncated-to-0", "truncated-to-60000", "pages-overwritten"])
async def test_a_damaged_index_refuses_start_and_the_rebuild_restores_every_entry(bookies, how):
    bk, = bookies(1, metadata_uri=None, checkpoint_interval=3600)
    acked = {(lg, e): body(lg, e) for lg in LEDGERS for e in range(ENTRIES)}
    async with await BookieClient.connect(bk.address, wait=30) as c:
        await asyncio.gather(*(c.add(lg, e, b, master_key=KEY) for (lg, e), b in acked.items()))
        await c.write_lac(11, ENTRIES - 1, KEY)
    await asyncio.to_thread(bk.stop)  # clean stop: a final checkpoint puts everything in the index
    data = bk.ledger_dirs[0] / "index" / DATA_FILE
    assert data.stat().st_size > 60_000
    damage(data, how)

    refused = run_cli(bk)
    first_line = (refused.stderr.strip().splitlines() or [""])[0]
    assert refused.returncode == 3, refused.stderr
    assert str(data) in first_line and "--rebuild-index" in first_line

    rebuilt = run_cli(bk, "--rebuild-index")
    assert rebuilt.returncode == 0, rebuilt.stderr
    summary = json.loads(rebuilt.stdout.strip().splitlines()[-1])
    assert summary["entries"] == len(acked) and summary["ledgers"] == len(LEDGERS)

    await asyncio.to_thread(bk.start)
    async with await BookieClient.connect(bk.address, wait=30) as c:
        for (lg, e), b in sorted(acked.items()):
            assert await c.read(lg, e) == b, f"entry {lg}:{e} not restored"
        for lg in LEDGERS:
            assert await c.list_entries(lg) == [(0, ENTRIES - 1)]
        assert await c.read_lac(11) == ENTRIES - 1


async def test_an_index_copied_from_another_bookie_refuses_start(bookies):
    mine, other = bookies(2, metadata_uri=None, checkpoint_interval=3600)
    for bk in (mine, other):
        async with await BookieClient.connect(bk.address, wait=30) as c:
            await asyncio.gather(*(c.add(11, e, body(11, e), master_key=KEY) for e in range(100)))
        await asyncio.to_thread(bk.stop)
    data = mine.ledger_dirs[0] / "index" / DATA_FILE
    data.write_bytes((other.ledger_dirs[0] / "index" / DATA_FILE).read_bytes())
    refused = run_cli(mine)
    first_line = (refused.stderr.strip().splitlines() or [""])[0]
    assert refused.returncode == 3
    assert str(data) in first_line and "belongs to journal" in first_line and "--rebuild-index" in first_line


async def test_after_a_rebuild_keys_are_checked_against_the_ledger_metadata(bookies, metadata_uri):
    """Master keys went with the index and, after a checkpoint, with the journal, and the metadata
    holds none: the rebuilt bookie checks the next key against the ledger's key check, so a wrong
    key is still refused afterwards and the owner's key still works."""
    from pybk.client.bookie_client import BookieError, Status
    from pybk.meta import MetadataStore

    bk, = bookies(1, checkpoint_interval=3600)
    async with await MetadataStore.connect(metadata_uri) as store:
        md = await store.ledgers.create([bk.bookie_id], 1, 1, key_check=entry.key_check(KEY))
    async with await BookieClient.connect(bk.address, wait=30) as c:
        await asyncio.gather(*(c.add(md.ledger_id, e, body(md.ledger_id, e), master_key=KEY) for e in range(100)))
    await asyncio.to_thread(bk.restart)  # the next checkpoint deletes the journal file with the key
    await asyncio.to_thread(bk.stop)
    assert not any(b"\x03" + md.ledger_id.to_bytes(8, "big") in p.read_bytes()
                   for p in bk.journal_dir.glob("journal-*.log")), "the master key record is still journaled"
    (bk.ledger_dirs[0] / "index" / DATA_FILE).unlink()
    rebuilt = run_cli(bk, "--rebuild-index")
    assert rebuilt.returncode == 0, rebuilt.stderr
    summary = json.loads(rebuilt.stdout.strip().splitlines()[-1])
    assert (summary["ledgers"], summary["ledgers_without_master_key"]) == (1, 1)
    await asyncio.to_thread(bk.start)
    async with await BookieClient.connect(bk.address, wait=30) as c:
        with pytest.raises(BookieError) as err:
            await c.fence(md.ledger_id, entry.master_key(b"wrong"))
        assert err.value.code is Status.UNAUTHORIZED and "metadata" in str(err.value)
        assert await c.fence(md.ledger_id, KEY) == 98  # the LAC entry 99 carried
        assert await c.read(md.ledger_id, 99) == body(md.ledger_id, 99)


async def test_the_rebuild_refuses_while_the_bookie_runs(bookies):
    bk, = bookies(1, metadata_uri=None)
    refused = run_cli(bk, "--rebuild-index")
    first_line = (refused.stderr.strip().splitlines() or [""])[0]
    assert refused.returncode == 3
    assert str(bk.journal_dir) in first_line and "in use" in first_line
    assert (bk.ledger_dirs[0] / "index" / DATA_FILE).exists() and bk.is_ready()
