"""Named logs on real etcd and bookies: names, offsets, readers."""
from __future__ import annotations

import pytest

from pybk.client import BookKeeper
from pybk.log import LogConfig, Logs, Rollover, WriterOptions

PW = b"log-password"


async def test_append_then_read_back(cluster):
    uri, _ = cluster
    async with await BookKeeper.connect(uri) as bk:
        logs = Logs(bk)
        await logs.create("orders", password=PW)
        async with await logs.open_writer("orders", password=PW) as w:
            offsets = [await w.append(b"r%d" % i, key=b"k" if i % 2 else None) for i in range(5)]
            offsets += list(await w.append_many([b"m%d" % i for i in range(100)]))
        assert offsets == list(range(105))
        async with await logs.open_reader("orders", end="latest") as r:
            recs = [rec async for rec in r]
        assert [r.offset for r in recs] == list(range(105))
        assert [r.payload for r in recs] == [b"r%d" % i for i in range(5)] + [b"m%d" % i for i in range(100)]
        assert [r.key for r in recs[:5]] == [None, b"k", None, b"k", None]
