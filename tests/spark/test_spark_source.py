"""The `pybk` data source against a real cluster (etcd + 3 bookie processes) and local[2] Spark.

Spark actions run in a worker thread (`in_thread`) so the test's event loop, which owns
the ledger client of an open ledger's writer, keeps running while Spark works.
"""
from __future__ import annotations

import asyncio
import re
import threading
import time
import urllib.request

import pytest

from pybk.client import BookKeeper
from pybk.meta.job_commit import JOB_KEY
from pybk.spark.session import activate

PW = b"spark-pw"


def payload(ledger: int, entry: int) -> bytes:
    """Distinct, binary payloads with varied lengths (including empty)."""
    if entry % 13 == 5:
        return b""
    return bytes([entry % 256, 0, 255]) + f"{ledger}:{entry}".encode() * (1 + entry % 7)


async def write_ledger(bk, n: int, close: bool = True, ensemble: int = 3, write_quorum: int = 3,
                       ack_quorum: int = 2, **meta: bytes):
    lh = await bk.create_ledger(ensemble=ensemble, write_quorum=write_quorum, ack_quorum=ack_quorum,
                                password=PW, metadata=meta or None)
    futs = [lh.add_entry_async(payload(lh.ledger_id, i)) for i in range(n)]
    assert await asyncio.gather(*futs) == list(range(n))
    if close:
        await lh.close()
    return lh


def source(spark, uri: str, ledgers: str, **options):
    r = (spark.read.format("pybk").option("metadataServiceUri", uri).option("ledgers", ledgers)
         .option("password", PW.decode()))
    for k, v in options.items():
        r = r.option(k, str(v))
    return r.load()


async def in_thread(spark, fn, *args):
    """Run a blocking Spark call in a worker thread, with spark active there (see activate)."""
    def call():
        activate(spark)
        return fn(*args)
    return await asyncio.to_thread(call)


def rows_of(df) -> list[tuple[int, int, bytes]]:
    return sorted((r.ledger_id, r.entry_id, bytes(r.payload)) for r in df.collect())


def bookie_reads(procs) -> int:
    """Entries read from all bookies so far (their pybk_bookie_reads counters)."""
    total = 0
    for p in procs:
        with urllib.request.urlopen(p.http_url + "/metrics", timeout=5) as resp:
            text = resp.read().decode()
        m = re.search(r"^pybk_bookie_reads_total\s+([0-9.eE+]+)$", text, re.M)
        total += int(float(m.group(1))) if m else 0
    return total


async def visible_lac(bk, ledger_id: int, want: int, timeout: float = 30) -> int:
    """The LAC a reader learns from bookies, once it reaches want (the writer tells bookies its
    LAC with its next add or shortly after it goes idle)."""
    reader = await bk.open_ledger(ledger_id, password=PW, recovery=False)
    deadline = time.monotonic() + timeout
    while (lac := await reader.read_last_add_confirmed()) < want and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert lac == want, f"ledger {ledger_id}: readers see LAC {lac}, writer acked {want}"
    return lac


@pytest.fixture
async def cluster(bookies, metadata_uri):
    procs = bookies(3)
    bk = await BookKeeper.connect(metadata_uri)
    try:
        yield metadata_uri, bk, procs
    finally:
        await bk.close()


async def test_batch_read_returns_exactly_the_written_entries(spark, cluster):
    uri, bk, _ = cluster
    a = await write_ledger(bk, 25)
    b = await write_ledger(bk, 7, ensemble=3, write_quorum=2, ack_quorum=2)
    c = await write_ledger(bk, 12, close=False)          # open: its writer keeps going afterwards
    lac = await visible_lac(bk, c.ledger_id, 11)
    ids = f"{a.ledger_id},{b.ledger_id},{c.ledger_id}"
    df = source(spark, uri, ids, entriesPerPartition=10)
    expected = sorted([(a.ledger_id, e, payload(a.ledger_id, e)) for e in range(25)]
                      + [(b.ledger_id, e, payload(b.ledger_id, e)) for e in range(7)]
                      + [(c.ledger_id, e, payload(c.ledger_id, e)) for e in range(lac + 1)])
    assert await in_thread(spark, rows_of, df) == expected
    assert df.rdd.getNumPartitions() == 3 + 1 + (lac + 1 + 9) // 10
    # reading did not fence the open ledger: its writer still adds and closes
    assert await c.add_entry(b"after the scan") == 12
    await c.close()
    # includeMetadata adds the ledgers' custom metadata; startEntry/endEntry bound every ledger
    m = await write_ledger(bk, 3, app=b"demo")
    dfm = source(spark, uri, str(m.ledger_id), includeMetadata="true")
    got = await in_thread(spark, dfm.collect)
    assert [r.ledger_metadata for r in got] == [{"app": b"demo"}] * 3
    dfr = source(spark, uri, f"{a.ledger_id}-{b.ledger_id}", startEntry=3, endEntry=5)
    assert await in_thread(spark, rows_of, dfr) == [
        (lid, e, payload(lid, e)) for lid in (a.ledger_id, b.ledger_id) for e in (3, 4, 5)]
    # unknown ledgers and an unreachable metadata service are clear errors
    with pytest.raises(Exception, match="unknown ledger"):
        await in_thread(spark, source(spark, uri, f"{a.ledger_id},999999").collect)
    # a closed range over sparse ids names how many are missing and the first few, not all
    existing = {a.ledger_id, b.ledger_id, c.ledger_id, m.ledger_id}
    first_missing = [i for i in range(1, 100) if i not in existing][:10]
    with pytest.raises(Exception, match=rf"option ledgers: {100000 - len(existing)} unknown ledger\(s\) in "
                                        rf"\S+: {', '.join(map(str, first_missing))} and "
                                        rf"{100000 - len(existing) - 10} more \(") as err:
        await in_thread(spark, source(spark, uri, "1-100000").collect)
    assert len(str(err.value)) < 5000
    with pytest.raises(Exception, match="unreachable"):
        await in_thread(spark, source(spark, "etcd://127.0.0.1:1/pybk", "1").collect)


@pytest.mark.skipif(not hasattr(__import__("pyspark.sql.datasource").sql.datasource, "EqualTo"),
                    reason="Python data source filter pushdown needs Spark 4.1+")
async def test_pushed_down_entry_range_reads_only_those_entries(spark, cluster):
    uri, bk, procs = cluster
    lh = await write_ledger(bk, 300)
    other = await write_ledger(bk, 50)
    df = source(spark, uri, "all").where("entry_id BETWEEN 120 AND 129 AND ledger_id = %d" % lh.ledger_id)
    before = await asyncio.to_thread(bookie_reads, procs)
    got = await in_thread(spark, rows_of, df)
    read = await asyncio.to_thread(bookie_reads, procs) - before
    assert got == [(lh.ledger_id, e, payload(lh.ledger_id, e)) for e in range(120, 130)]
    assert 10 <= read <= 20, f"bookies served {read} entries for a 10-entry pushed-down range"
    assert other.ledger_id != lh.ledger_id


async def test_stream_follows_an_open_ledger_and_resumes_from_its_checkpoint(spark, cluster, tmp_path):
    uri, bk, _ = cluster
    lh = await write_ledger(bk, 0, close=False)
    batches: dict[int, list[tuple[int, int, bytes]]] = {}
    lock = threading.Lock()

    def collect(batch_df, batch_id):
        rows = rows_of(batch_df)
        with lock:
            batches[batch_id] = rows  # a replayed batch id replaces its first attempt

    def seen() -> list[tuple[int, int, bytes]]:
        with lock:
            return [r for _, rows in sorted(batches.items()) for r in rows]

    async def add(n: int) -> int:
        start = lh.last_add_confirmed + 1
        await asyncio.gather(*(lh.add_entry_async(payload(lh.ledger_id, start + i)) for i in range(n)))
        return start + n - 1

    async def wait_for(last: int, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(e == last for _, e, _ in seen()):
                return
            await asyncio.sleep(0.2)
        raise AssertionError(f"stream did not reach entry {last}; saw {len(seen())} rows")

    def stream(trigger: dict):
        return (spark.readStream.format("pybk").option("metadataServiceUri", uri)
                .option("ledgers", f"{lh.ledger_id}-").option("password", PW.decode())
                .option("maxEntriesPerTrigger", "7").load()
                .writeStream.foreachBatch(collect).option("checkpointLocation", str(tmp_path / "ckpt"))
                .trigger(**trigger).start())

    last = await add(20)
    query = await in_thread(spark, stream, {"processingTime": "200 milliseconds"})
    try:
        await wait_for(last)
        last = await add(15)                    # entries added while the query runs
        await wait_for(last)
    finally:
        await in_thread(spark, query.stop)
    last = await add(12)                        # added while no query runs
    second = await bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2, password=PW)
    await asyncio.gather(*(second.add_entry_async(payload(second.ledger_id, i)) for i in range(4)))
    await second.close()
    query = await in_thread(spark, stream, {"availableNow": True})  # restart from the checkpoint
    await in_thread(spark, query.awaitTermination, 180)
    rows = seen()
    assert [r for r in rows if r[0] == lh.ledger_id] == [
        (lh.ledger_id, e, payload(lh.ledger_id, e)) for e in range(last + 1)]  # no dups, no gaps
    assert sorted(r for r in rows if r[0] == second.ledger_id) == [
        (second.ledger_id, e, payload(second.ledger_id, e)) for e in range(4)]
    assert max(len(b) for b in batches.values()) <= 7
    assert len(batches) >= (last + 1 + 4) // 7
    await lh.close()


async def test_write_then_read_back_and_failed_jobs_leave_no_ledgers(spark, cluster):
    uri, bk, _ = cluster
    data = [payload(0, i) for i in range(250)]
    df = spark.createDataFrame([(p,) for p in data], "payload binary").repartition(3)

    def save(frame, job: str, **extra):
        w = (frame.write.format("pybk").mode("append").option("metadataServiceUri", uri)
             .option("password", PW.decode()).option("jobId", job).option("ensembleSize", "3")
             .option("writeQuorum", "2").option("ackQuorum", "2"))
        for k, v in extra.items():
            w = w.option(k, v)
        w.save()

    await in_thread(spark, save, df, "job-ok")
    from pybk.spark import written_ledgers
    written = written_ledgers(uri, "job-ok")
    assert sorted(written) == [0, 1, 2]
    for lid in written.values():
        md = await bk.ledger_metadata(lid)
        assert md.state.name == "CLOSED" and md.custom[JOB_KEY] == b"job-ok"
    back = source(spark, uri, ",".join(map(str, written.values())))
    assert sorted(bytes(r.payload) for r in await in_thread(spark, back.collect)) == sorted(data)

    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType

    def boom(i):  # self-contained: Spark's Python workers cannot import this test module
        import time as t
        if i == 299:
            t.sleep(2)  # let the other partitions finish and commit their ledgers first
            raise ValueError("injected failure in the last partition")
        return b"row %d" % i

    failing = spark.range(0, 300, numPartitions=3).select(F.udf(boom, BinaryType())("id").alias("payload"))
    with pytest.raises(Exception, match="injected failure"):
        await in_thread(spark, save, failing, "job-bad")
    assert written_ledgers(uri, "job-bad") == {}
    assert sorted([lid async for lid in bk.list_ledgers()]) == sorted(written.values())
    with pytest.raises(Exception, match="append-only"):
        await in_thread(spark, lambda: df.write.format("pybk").mode("overwrite")
                                .option("metadataServiceUri", uri).save())
    with pytest.raises(Exception, match="needs a column named payload"):
        await in_thread(spark, lambda: spark.range(3).write.format("pybk").mode("append")
                                .option("metadataServiceUri", uri).save())


async def test_commit_deletes_ledgers_of_task_attempts_that_did_not_commit(spark, cluster):
    from pybk.spark import written_ledgers
    from pybk.meta.job_commit import pending_tags
    uri, bk, _ = cluster
    # what a task attempt killed mid-write leaves behind: an OPEN pending ledger tagged with the job
    stray = await write_ledger(bk, 5, close=False, **pending_tags("job-retried", 1))
    data = [payload(0, i) for i in range(60)]
    df = spark.createDataFrame([(p,) for p in data], "payload binary").repartition(2)
    await in_thread(spark, lambda: df.write.format("pybk").mode("append").option("metadataServiceUri", uri)
                    .option("password", PW.decode()).option("jobId", "job-retried").save())
    written = written_ledgers(uri, "job-retried")
    assert sorted(written) == [0, 1] and stray.ledger_id not in written.values()
    assert sorted([lid async for lid in bk.list_ledgers()]) == sorted(written.values())
    back = source(spark, uri, ",".join(map(str, written.values())))
    assert sorted(bytes(r.payload) for r in await in_thread(spark, back.collect)) == sorted(data)


async def test_corrupted_replica_does_not_corrupt_results(spark, cluster):
    """One bookie's copies of every entry damaged on its disk (a payload byte flipped in its entry
    log while it is stopped): the source reads past them, every row as written."""
    from entrylog_files import records
    from pybk.client.bookie_client import BookieClient, BookieError
    from pybk.entry import DigestMismatch, decode
    uri, bk, procs = cluster
    lh = await write_ledger(bk, 60)
    md = await bk.ledger_metadata(lh.ledger_id)
    victim = next(p for p in procs if p.bookie_id == md.fragments[0].bookies[0])
    victim.stop()  # a clean stop checkpoints: every entry is in its entry logs
    damaged = 0
    for log in victim.ledger_dirs[0].rglob("*.log"):
        data = bytearray(log.read_bytes())
        for ledger, _, offset, length in records(log):
            if ledger == lh.ledger_id:
                data[offset + length - 1] ^= 0xFF   # the body's last byte: payload, or digest when empty
                damaged += 1
        log.write_bytes(bytes(data))
    assert damaged == 60
    victim.start()
    async with await BookieClient.connect(victim.address) as bc:
        with pytest.raises((DigestMismatch, BookieError)):  # the victim serves no good copy now
            decode(await bc.read(lh.ledger_id, 7), md.digest_type, PW)
    df = source(spark, uri, str(lh.ledger_id), entriesPerPartition=25)
    assert await in_thread(spark, rows_of, df) == [
        (lh.ledger_id, e, payload(lh.ledger_id, e)) for e in range(60)]

