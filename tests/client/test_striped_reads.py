"""Range reads of striped ledgers (E > Qw) stream each bookie's share with one strided read
per chunk, and fall back to per-entry reads from the other replicas when a bookie is gone."""
from __future__ import annotations

import asyncio
import re

from client_helpers import expected, flip_in_entry_logs, payload, read_all

from pybk.client import BookKeeper

ENTRIES = 3000


def counter(bookie, name: str) -> float:
    text = bookie.http_get("/metrics")[1].decode()
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


async def write_striped(uri: str) -> int:
    async with await BookKeeper.connect(uri) as bk:
        lh = await bk.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, password=b"pw")
        for a in range(0, ENTRIES, 500):
            await asyncio.gather(*(lh.add_entry_async(payload(lh.ledger_id, i)) for i in range(a, a + 500)))
        await lh.close()
        return lh.ledger_id


async def test_striped_ledger_reads_back_with_each_entry_read_about_once(cluster_factory):
    cluster = cluster_factory(3)
    lid = await write_striped(cluster.uri)

    def totals():
        return (sum(counter(b, "pybk_bookie_reads_total") for b in cluster.bookies),
                sum(counter(b, "pybk_bookie_read_requests_total") for b in cluster.bookies))

    reads0, requests0 = await asyncio.to_thread(totals)
    async with await BookKeeper.connect(cluster.uri) as bk:
        rh = await bk.open_ledger(lid, password=b"pw")
        assert await read_all(rh) == expected(lid, ENTRIES - 1)
    reads1, requests1 = await asyncio.to_thread(totals)
    assert ENTRIES <= reads1 - reads0 <= 1.2 * ENTRIES
    assert requests1 - requests0 <= ENTRIES / 20      # strided range reads, not one RPC per entry


async def test_striped_ledger_reads_back_with_a_bookie_killed(cluster_factory):
    cluster = cluster_factory(3)
    lid = await write_striped(cluster.uri)
    cluster.bookies[0].kill()
    async with await BookKeeper.connect(cluster.uri) as bk:
        rh = await bk.open_ledger(lid, password=b"pw")
        assert await read_all(rh) == expected(lid, ENTRIES - 1)
        assert await read_all(rh, 17, 2500) == expected(lid, 2500)[17:]


async def test_striped_reads_follow_each_fragments_ensemble(cluster_factory):
    cluster = cluster_factory(4)
    async with await BookKeeper.connect(cluster.uri) as bk:
        lh = await bk.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, password=b"pw")
        lid = lh.ledger_id
        await asyncio.gather(*(lh.add_entry_async(payload(lid, i)) for i in range(1000)))
        cluster.by_id(lh.metadata.fragments[0].bookies[1]).kill()
        await asyncio.gather(*(lh.add_entry_async(payload(lid, i)) for i in range(1000, 2000)))
        await lh.close()
        assert len(lh.metadata.fragments) == 2
    async with await BookKeeper.connect(cluster.uri) as bk:
        rh = await bk.open_ledger(lid, password=b"pw")
        assert await read_all(rh) == expected(lid, 1999)
        assert await read_all(rh, 990, 1010) == expected(lid, 1010)[990:]


async def test_striped_read_takes_an_entry_from_the_other_replica_when_one_copy_is_corrupt(cluster_factory):
    cluster = cluster_factory(3)
    lid = await write_striped(cluster.uri)
    async with await BookKeeper.connect(cluster.uri) as bk:
        md = await bk.ledger_metadata(lid)
    victim = cluster.by_id(md.fragments[0].bookies[1000 % 3])   # first replica of entry 1000
    victim.stop()                                               # a clean stop checkpoints to the entry log
    assert flip_in_entry_logs(victim, payload(lid, 1000)) == 1
    victim.start()
    async with await BookKeeper.connect(cluster.uri) as bk:
        rh = await bk.open_ledger(lid, password=b"pw")
        assert await read_all(rh) == expected(lid, ENTRIES - 1)
        assert bk.digest_mismatches >= 1
