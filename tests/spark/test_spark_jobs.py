"""The example jobs in spark/: per-ledger statistics and Parquet export, on a real cluster."""
from __future__ import annotations

import asyncio
import json

import pyarrow.parquet as pq
import pytest

from pybk.client import BookKeeper
from pybk.spark.jobs import export_parquet, ledger_stats, stats_main
from pybk.spark.session import activate

PW = b"jobs"


@pytest.fixture
async def ledgers(bookies, metadata_uri):
    bookies(3)
    written: dict[int, list[bytes]] = {}
    async with await BookKeeper.connect(metadata_uri) as bk:
        for n in (5, 17):
            lh = await bk.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, password=PW)
            data = [b"event-%d-%d" % (n, i) * (i + 1) for i in range(n)]
            await asyncio.gather(*(lh.add_entry_async(d) for d in data))
            await lh.close()
            written[lh.ledger_id] = data
    return metadata_uri, written


async def test_ledger_stats_counts_entries_bytes_and_entry_range_per_ledger(spark, ledgers, capsys):
    uri, written = ledgers
    ids = ",".join(map(str, written))

    def run():
        activate(spark)
        return [r.asDict() for r in ledger_stats(spark, uri, ids, PW.decode()).collect()]
    rows = await asyncio.to_thread(run)
    assert rows == [{"ledger_id": lid, "entries": len(d), "bytes": sum(map(len, d)),
                     "first_entry": 0, "last_entry": len(d) - 1} for lid, d in sorted(written.items())]
    argv = ["-m", uri, "--ledgers", ids, "--password", PW.decode(), "-o", "json"]
    assert await asyncio.to_thread(stats_main, argv) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == rows


async def test_export_writes_every_entry_to_parquet(spark, ledgers, tmp_path):
    uri, written = ledgers
    out = tmp_path / "export"

    def run():
        activate(spark)
        return export_parquet(spark, uri, str(out), "all", PW.decode())
    assert await asyncio.to_thread(run) == sum(map(len, written.values()))
    table = pq.read_table(out)
    got = sorted(zip(table.column("ledger_id").to_pylist(), table.column("entry_id").to_pylist(),
                     table.column("payload").to_pylist()))
    assert got == sorted((lid, i, d) for lid, data in written.items() for i, d in enumerate(data))


async def test_log_counts_writes_per_minute_counts_by_key_to_parquet(spark, bookies, metadata_uri, tmp_path):
    """Slow: the example job as a user runs it, a Spark job of its own (a pattern resolved, a scan
    with its planning workers, an aggregation and a Parquet write): 20-35 s at four workers."""
    from pybk.log import Logs
    from pybk.spark.jobs import log_counts_main
    bookies(3)
    minute = 60_000
    t0 = 1_764_201_600_000                      # a whole minute (2025-11-27 00:00 UTC)
    async with await BookKeeper.connect(metadata_uri) as bk:
        logs = Logs(bk)
        await logs.create("orders", password=PW)
        async with await logs.open_writer("orders", password=PW) as w:
            for i in range(90):                 # 30 records a minute over three minutes, keys a and b
                await w.append(b"x" * i, key=b"ab"[i % 2:i % 2 + 1], timestamp=t0 + i * 2000)
    out = tmp_path / "counts"
    argv = ["-m", metadata_uri, "--log", "ord.*", str(out), "-o", "json"]
    assert await asyncio.to_thread(lambda: (activate(spark), log_counts_main(argv))[1]) == 0
    table = pq.read_table(out).to_pylist()
    got = sorted((r["log"], r["minute"].timestamp() * 1000, r["key"], r["records"], r["bytes"]) for r in table)
    want = sorted(("orders", t0 + m * minute, k, 15, sum(i for i in range(m * 30, m * 30 + 30) if "ab"[i % 2] == k))
                  for m in range(3) for k in "ab")
    assert got == want
