"""The `pybk` data source over named logs (option log) against a real cluster (etcd + 3 bookie
processes) and local[2] Spark: reads by name and pattern, Kafka-style positions, data loss,
streaming resume, cursors, and the exactly-once sink.

Spark actions run in a worker thread (`in_thread`) so the test's event loop, which owns the log
writers, keeps running while Spark works.
"""
from __future__ import annotations

import asyncio
import json

import pytest

from pybk.client import BookKeeper
from pybk.log import LogConfig, Logs, Rollover, WriterOptions
from pybk.spark.session import activate

PW = b"log-pw"


def body(log: str, i: int) -> bytes:
    """Distinct payloads of varied lengths (some empty)."""
    return b"" if i % 11 == 7 else f"{log}#{i}:".encode() + bytes([i % 256]) * (i % 23)


def key(i: int) -> bytes | None:
    return None if i % 3 == 0 else b"k%d" % (i % 5)


async def in_thread(spark, fn, *args):
    def call():
        activate(spark)
        return fn(*args)
    return await asyncio.to_thread(call)


def read(spark, uri: str, logs: str, **options):
    r = spark.read.format("pybk").option("metadataServiceUri", uri).option("log", logs)
    for k, v in options.items():
        r = r.option(k, v if isinstance(v, str) else json.dumps(v))
    return r.load()


def rows(df) -> list[tuple]:
    return sorted((r.log, r.offset, None if r.key is None else bytes(r.key), bytes(r.payload))
                  for r in df.collect())


@pytest.fixture
async def cluster(bookies, metadata_uri):
    bookies(3)
    async with await BookKeeper.connect(metadata_uri) as bk:
        yield metadata_uri, bk, Logs(bk)


async def fill(logs: Logs, name: str, n: int, *, roll_every: int = 0, producer: int | None = None,
               start: int = 0, timestamps: list[int] | None = None) -> None:
    """Create `name` if needed and append records start..start+n-1 (keys on two records in three),
    rolling a segment every `roll_every` records."""
    if name not in await logs.list():
        await logs.create(name, LogConfig(rollover=Rollover(max_bytes=None)), password=PW)
    async with await logs.open_writer(name, password=PW, options=WriterOptions(producer_id=producer)) as w:
        for i in range(start, start + n):
            ts = timestamps[i - start] if timestamps else None
            w.append_nowait(body(name, i), key=key(i), timestamp=ts)
            if roll_every and (i + 1) % roll_every == 0:
                await w.flush()
                await w.roll()
        await w.flush()


def expected(name: str, offsets) -> list[tuple]:
    return [(name, i, key(i), body(name, i)) for i in offsets]


async def test_batch_read_by_name_and_pattern_with_positions_and_partitions(spark, cluster):
    """Slow: 5 Spark actions, with many small partitions; when it runs first, also the session's
    first scans (the JVM compiles them), up to a minute on a loaded 2-core machine."""
    uri, bk, logs = cluster
    await fill(logs, "orders.eu", 700, roll_every=250)
    await fill(logs, "orders.us", 40, producer=77)
    await fill(logs, "audit", 5)
    df = read(spark, uri, "orders\\..*", bytesPerPartition="2000", minPartitions="4")
    assert df.columns == ["log", "offset", "timestamp", "key", "payload", "producer_id", "sequence"]
    got = await in_thread(spark, rows, df)
    assert got == expected("orders.eu", range(700)) + expected("orders.us", range(40))
    assert df.rdd.getNumPartitions() >= 4
    prod = await in_thread(spark, lambda: sorted((r.log, r.offset, r.producer_id, r.sequence)
                                                 for r in df.where("log = 'orders.us' OR offset < 3").collect()))
    assert prod == [("orders.eu", i, None, None) for i in range(3)] + [("orders.us", i, 77, i) for i in range(40)]
    # names, JSON positions by log (a range that starts and ends inside segments), no producer columns
    df = read(spark, uri, "audit,orders.eu", startingOffsets={"orders.eu": 240}, endingOffsets={"orders.eu": 510})
    assert df.columns == ["log", "offset", "timestamp", "key", "payload"]
    assert await in_thread(spark, rows, df) == expected("audit", range(5)) + expected("orders.eu", range(240, 510))
    assert await in_thread(spark, rows, read(spark, uri, "audit", startingOffsets="latest")) == []


async def test_batch_read_starts_at_a_time_and_reports_truncated_offsets(spark, cluster):
    uri, bk, logs = cluster
    await fill(logs, "clicks", 300, roll_every=100, timestamps=[1_000_000 + 10 * i for i in range(300)])
    df = read(spark, uri, "clicks", startingTimestamp="1001500")
    assert await in_thread(spark, rows, df) == expected("clicks", range(150, 300))
    df = read(spark, uri, "clicks", startingOffsetsByTimestamp={"clicks": 1_002_000})
    assert await in_thread(spark, rows, df) == expected("clicks", range(200, 300))
    assert await logs.truncate("clicks", 200, password=PW) == 200
    with pytest.raises(Exception, match=r"log 'clicks': offset 120 was truncated away .* starts at offset 200"):
        await in_thread(spark, rows, read(spark, uri, "clicks", startingOffsets={"clicks": 120}))
    skipped = read(spark, uri, "clicks", startingOffsets={"clicks": 120}, failOnDataLoss="false")
    assert await in_thread(spark, rows, skipped) == expected("clicks", range(200, 300))
    with pytest.raises(Exception, match="log 'nope' does not exist"):
        await in_thread(spark, rows, read(spark, uri, "nope"))
