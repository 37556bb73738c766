"""The `pybk` data source over named logs (option log) against a real cluster (etcd + 3 bookie
processes) and local[2] Spark: reads by name and pattern, Kafka-style positions, data loss,
streaming resume, cursors, and the exactly-once sink.

Spark actions run in a worker thread (`in_thread`) so the test's event loop, which owns the log
writers, keeps running while Spark works.
"""
from __future__ import annotations

import asyncio
import contextlib
import json

import pytest

from pybk.client import BookKeeper
from pybk.log import LogConfig, LogFencedError, Logs, Rollover, WriterOptions
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


class Collector:
    """foreachBatch sink keeping each batch's (log, offset, payload) rows by batch id (a replayed
    batch replaces its first attempt)."""

    def __init__(self):
        import threading
        self.lock = threading.Lock()
        self.batches: dict[int, list[tuple[str, int, bytes]]] = {}

    def __call__(self, batch_df, batch_id: int) -> None:
        got = [(r.log, r.offset, bytes(r.payload)) for r in batch_df.collect()]
        with self.lock:
            self.batches[batch_id] = got

    def rows(self, log: str | None = None) -> list[tuple[str, int, bytes]]:
        with self.lock:
            out = [r for _, b in sorted(self.batches.items()) for r in b]
        return [r for r in out if log is None or r[0] == log]

    def offsets(self, log: str) -> list[int]:
        return [o for _, o, _ in self.rows(log)]


async def test_stream_resumes_with_no_duplicate_and_no_gap_across_failover_rolls_truncation_and_new_logs(
        spark, cluster, tmp_path):
    """Slow: three query runs of many 200 ms micro-batches, and the writes between them (about a minute)."""
    from polling import eventually
    uri, bk, logs = cluster
    await fill(logs, "events.a", 50, roll_every=20)
    sink = Collector()

    def start(trigger: dict, **options):
        r = (spark.readStream.format("pybk").option("metadataServiceUri", uri).option("log", "events\\..*")
             .option("maxRecordsPerTrigger", "30").option("cursor", "spark-q"))
        for k, v in options.items():
            r = r.option(k, v)
        return (r.load().writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path / "ckpt"))
                .trigger(**trigger).start())

    query = await in_thread(spark, start, {"processingTime": "200 milliseconds"})
    try:
        await eventually(lambda: len(sink.offsets("events.a")) >= 50, 120, 0.2, "the first 50 records")
        # writer failover: a second writer fences the first mid-stream; a roll in between
        w1 = await logs.open_writer("events.a", password=PW)
        await asyncio.gather(*(w1.append_nowait(body("events.a", i), key=key(i)) for i in range(50, 80)))
        await w1.roll()
        async with await logs.open_writer("events.a", password=PW) as w2:
            await asyncio.gather(*(w2.append_nowait(body("events.a", i), key=key(i)) for i in range(80, 110)))
        with contextlib.suppress(LogFencedError):   # the fenced writer learns it when sealing its segment
            await w1.close()
        await fill(logs, "events.b", 12)          # a new log matching the pattern
        await eventually(lambda: len(sink.offsets("events.a")) >= 110 and len(sink.offsets("events.b")) >= 12,
                         120, 0.2, "records after the failover and of the new log")
    finally:
        await in_thread(spark, query.stop)
    assert sink.rows("events.a") == [("events.a", i, body("events.a", i)) for i in range(110)]
    assert max(len(b) for b in sink.batches.values()) <= 30
    # Spark commits a batch's source offsets when it plans the next one: the cursor trails by at most a batch
    cursor = {c.name: c.offset for c in await logs.cursors("events.a")}["spark-q"]
    assert 110 - 30 <= cursor <= 110

    # stopped: more records, and a truncation of records the query has read already
    await fill(logs, "events.a", 40, start=110, roll_every=15)
    await logs.truncate("events.a", 100, password=PW)
    query = await in_thread(spark, start, {"availableNow": True})
    await in_thread(spark, query.awaitTermination, 180)
    assert sink.rows("events.a") == [("events.a", i, body("events.a", i)) for i in range(150)]
    assert sink.rows("events.b") == [("events.b", i, body("events.b", i)) for i in range(12)]

    # stopped again: records the query has not read are truncated away
    await fill(logs, "events.a", 45, start=150, roll_every=15)
    start_now = await logs.truncate("events.a", 180, password=PW)
    assert 150 < start_now <= 180
    query = await in_thread(spark, start, {"availableNow": True})
    with pytest.raises(Exception, match=rf"log 'events.a': offset 150 was truncated away .* starts at offset "
                                        rf"{start_now}"):
        await in_thread(spark, query.awaitTermination, 180)
    query = await in_thread(spark, lambda: start({"availableNow": True}, failOnDataLoss="false"))
    await in_thread(spark, query.awaitTermination, 180)
    assert sink.offsets("events.a") == list(range(150)) + list(range(start_now, 195))
