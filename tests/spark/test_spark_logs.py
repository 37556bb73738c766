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
import re

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


async def test_a_narrower_schema_reads_only_its_columns_and_one_it_cannot_fill_is_refused(spark, cluster, tmp_path):
    """spark.read.schema(...) naming some log columns, in any order: the scan (batch or stream)
    builds only those."""
    uri, bk, logs = cluster
    await fill(logs, "narrow", 300, roll_every=120, producer=5)
    r = spark.read.format("pybk").option("metadataServiceUri", uri).option("log", "narrow")
    df = r.schema("payload binary, offset long, sequence long").option("bytesPerPartition", "3000").load()
    assert df.columns == ["payload", "offset", "sequence"]
    got = await in_thread(spark, lambda: sorted((r.offset, bytes(r.payload), r.sequence) for r in df.collect()))
    assert got == [(i, body("narrow", i), i) for i in range(300)]
    with pytest.raises(Exception, match="schema: column payload is binary, not string"):
        await in_thread(spark, r.schema("offset long, payload string").load().collect)
    sink = Collector()

    def stream():
        query = (spark.readStream.format("pybk").schema("payload binary, offset long, log string")
                 .option("metadataServiceUri", uri).option("log", "narrow").load().writeStream.foreachBatch(sink)
                 .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start())
        query.awaitTermination(120)
        return query
    await in_thread(spark, stream)
    assert sink.rows() == [("narrow", i, body("narrow", i)) for i in range(300)]


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

        async def cursor_at_end():   # committed when the next trigger finds the finished batch's end
            return {c.name: c.offset for c in await logs.cursors("events.a")} == {"spark-q": 110}
        await eventually(cursor_at_end, 60, 0.2, "the durable cursor at the end of what the query processed")
    finally:
        await in_thread(spark, query.stop)
    assert sink.rows("events.a") == [("events.a", i, body("events.a", i)) for i in range(110)]
    assert max(len(b) for b in sink.batches.values()) <= 30

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

    # a new query (no checkpoint) with the cursor starts where the cursor is
    assert {c.name: c.offset for c in await logs.cursors("events.a")} == {"spark-q": 195}
    await fill(logs, "events.a", 5, start=195)
    cursor = 195
    fresh = Collector()

    def from_cursor():
        return (spark.readStream.format("pybk").option("metadataServiceUri", uri).option("log", "events.a")
                .option("cursor", "spark-q").load().writeStream.foreachBatch(fresh)
                .option("checkpointLocation", str(tmp_path / "ckpt2")).trigger(availableNow=True).start())
    query = await in_thread(spark, from_cursor)
    await in_thread(spark, query.awaitTermination, 180)
    assert fresh.offsets("events.a") == list(range(cursor, 200))


async def log_records(logs: Logs, name: str) -> list:
    async with await logs.open_reader(name, end="latest") as r:
        return [rec async for rec in r]


async def staged_ledgers(bk) -> list[int]:
    """Ledgers staged for a log by a write job (what a finished job leaves none of)."""
    from pybk.spark.logwriter import LOG_KEY
    return [md.ledger_id async for md in bk.store.ledgers.list_metadata() if LOG_KEY in md.custom]


async def test_batch_write_appends_in_partition_order_once_and_a_failed_job_appends_nothing(spark, cluster):
    """Slow: three write jobs and a read, each a Spark job with its own planning workers (about a minute
    on a loaded 2-core machine)."""
    from polling import eventually
    uri, bk, logs = cluster
    await logs.create("out", password=PW)
    df = spark.range(0, 300, numPartitions=3).selectExpr(
        "concat('row-', id) AS payload",
        "CASE WHEN id % 3 = 0 THEN NULL ELSE cast(concat('k', id % 4) AS binary) END AS key",
        "timestamp_millis(1700000000000 + id * 10) AS timestamp")

    def write(frame, job: str | None = None):
        w = frame.write.format("pybk").mode("append").option("metadataServiceUri", uri).option("log", "out") \
            .option("password", PW.decode())
        (w.option("jobId", job) if job else w).save()

    await in_thread(spark, write, df, "first-job")
    recs = await log_records(logs, "out")
    assert [(r.offset, r.payload, r.key, r.timestamp) for r in recs] == [
        (i, b"row-%d" % i, None if i % 3 == 0 else b"k%d" % (i % 4), 1700000000000 + i * 10) for i in range(300)]
    with pytest.raises(Exception, match="job first-job was already committed"):
        await in_thread(spark, write, df, "first-job")
    # a task that fails after others staged their rows: the job appends nothing and leaves no ledger
    from pyspark.sql import functions as F

    @F.udf("string")
    def boom(p: str) -> str:
        if p == "row-250":
            raise ValueError("a bad row")
        return p
    with pytest.raises(Exception, match="a bad row"):
        await in_thread(spark, write, df.withColumn("payload", boom("payload")))
    assert await logs.end_offset("out") == 300

    async def none_staged():
        return not await staged_ledgers(bk)
    await eventually(none_staged, 30, 0.2, "no staged ledger left")


async def test_stream_sink_appends_each_micro_batch_once_across_driver_kill_and_task_retries(cluster, tmp_path):
    """Slow: two Spark drivers in child processes (each starts its own JVM), the first killed with -9."""
    import os
    import sys
    from pathlib import Path

    from polling import eventually

    from pybk.local.process import ChildProcess
    from pybk.spark.logwriter import FAILPOINT_ENV
    from pybk.spark.session import java_problem
    if java_problem():
        pytest.skip(java_problem())
    uri, bk, logs = cluster
    await fill(logs, "in", 400, roll_every=150)
    await logs.create("out", password=PW)
    marker = tmp_path / "failpoints"
    argv = [sys.executable, str(Path(__file__).parent / "log_sink_child.py"), uri, "in", "out", PW.decode(),
            str(tmp_path / "ckpt")]
    env = {**os.environ, FAILPOINT_ENV: f"sink.task_first_attempt:{marker},sink.mid_append:{marker}"}
    first = ChildProcess("sink-driver", argv, tmp_path / "first.log", env).start()
    try:
        def at_mid_append():
            assert first.alive(), f"the driver exited:\n{first.log_tail()}"
            return marker.exists() and "sink.mid_append" in marker.read_text()
        await eventually(at_mid_append, 240, 0.2, "the first driver half-way through appending a micro-batch")
        assert "sink.task_first_attempt" in marker.read_text()      # tasks failed once and were retried
        # a generated job id is printed where the user running the driver sees it
        assert re.search(r"^pybk write job [0-9a-f]{32} starting", first.log_path.read_text(), re.M)

        async def some_visible():   # the last entry becomes visible to readers with the writer's explicit LAC
            return len(await log_records(logs, "out"))
        partial = await eventually(some_visible, 30, 0.1, "part of the micro-batch visible in the output log")
        assert partial <= 50      # at most half of the first micro-batch (100 records): killed mid-batch
    finally:
        first.kill()
    second = ChildProcess("sink-driver", argv, tmp_path / "second.log",
                          {k: v for k, v in os.environ.items() if k != FAILPOINT_ENV}).start()
    try:
        await eventually(lambda: "DONE" in Path(second.log_path).read_text(errors="replace") or
                         (not second.alive() and pytest.fail(f"the driver failed:\n{second.log_tail()}")),
                         300, 0.5, "the restarted driver to finish")
    finally:
        second.stop()
    got = await log_records(logs, "out")
    want = await log_records(logs, "in")
    assert [(r.offset, r.key, r.payload, r.timestamp) for r in got] == [
        (r.offset, r.key, r.payload, r.timestamp) for r in want]
    # the killed driver's segment, then one for all four micro-batches of the second driver: its
    # writer stays open between them, with every record readable meanwhile
    segments = (await logs.describe("out")).segments
    assert [(s.state.value, s.first_offset) for s in segments] == [("CLOSED", 0), ("OPEN", 50)]

    async def none_staged():
        return not await staged_ledgers(bk)
    await eventually(none_staged, 30, 0.2, "no staged ledger left")


async def test_a_log_write_commit_run_again_appends_exactly_what_is_missing(cluster):
    """A batch job's commit that died after appending part of the job (left here by appending that
    prefix with the job's producer id and sequences, as the commit does), run again with the same
    job id: the rest is appended once; run once more after it is recorded: nothing."""
    import pyarrow as pa

    from pybk.meta.job_commit import pending_tags
    from pybk.spark.logoptions import LogWriteOptions
    from pybk.spark.logwriter import LOG_KEY, Columns, commit_job, producer_id, stage_partition
    from pybk.spark.runtime import run
    uri, bk, logs = cluster
    await logs.create("resumed", password=PW)
    opts = LogWriteOptions.parse({"metadataServiceUri": uri, "log": "resumed", "password": PW.decode()})
    job = "resumed-job"
    parts = [[b"p%d-r%d" % (p, i) for i in range(n)] for p, n in enumerate([30, 0, 25])]

    def stage(p: int):
        batch = pa.record_batch([pa.array(parts[p], pa.binary())], names=["payload"])
        return run(stage_partition(opts, (3, 3, 2), Columns("payload"), iter([batch]), p, job,
                                   pending_tags(job, p, {LOG_KEY: "resumed"})))
    staged = [await asyncio.to_thread(stage, p) for p in range(3)]
    assert [s.records for s in staged] == [30, 0, 25] and staged[1].ledger_id is None
    rows = [r for p in parts for r in p]
    async with await logs.open_writer("resumed", password=PW,
                                      options=WriterOptions(producer_id=producer_id("job", job))) as w:
        for seq in range(40):                    # what a commit killed after 40 records had stored
            await w.append(rows[seq], sequence=seq)
    done = await asyncio.to_thread(lambda: run(commit_job(opts, job, staged, producer_id("job", job), 0)))
    assert (done.skipped, done.appended) == (40, 15)
    assert [r.payload for r in await log_records(logs, "resumed")] == rows
    again = await asyncio.to_thread(lambda: run(commit_job(opts, job, staged, producer_id("job", job), 0)))
    assert (again.skipped, again.appended) == (0, 0)
    assert [r.payload for r in await log_records(logs, "resumed")] == rows
    assert not await staged_ledgers(bk)


async def test_a_stream_by_pattern_starts_before_any_log_matches_and_reads_them_as_they_appear(
        spark, cluster, tmp_path):
    from polling import eventually
    uri, bk, logs = cluster
    sink = Collector()

    def start():
        return (spark.readStream.format("pybk").option("metadataServiceUri", uri).option("log", "late\\..*")
                .option("includeProducer", "false").load().writeStream.foreachBatch(sink)
                .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(processingTime="200 milliseconds")
                .start())
    query = await in_thread(spark, start)
    try:
        await fill(logs, "late.one", 7)
        await eventually(lambda: len(sink.rows()) >= 7, 120, 0.2, "the records of a log created after the start")
    finally:
        await in_thread(spark, query.stop)
    assert sink.rows() == [("late.one", i, body("late.one", i)) for i in range(7)]
