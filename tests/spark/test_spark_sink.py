"""The streaming sink `writeStream.format("pybk")`: each micro-batch's rows are stored exactly once,
across a failed batch, a restart from the checkpoint and a commit that Spark lost.

Real cluster (etcd + 3 bookie processes), local[2] Spark; helpers from test_spark_source.
"""
from __future__ import annotations

import asyncio
import logging

import pyarrow as pa
import pytest
from pyspark.sql.types import BinaryType, StructField, StructType

from pybk.meta.jobs import JobOutcome, JobRecord
from pybk.meta.job_commit import JOB_KEY, WriteState, state_of
from pybk.spark.options import OptionError, WriteOptions
from pybk.spark.runtime import run
from pybk.spark.source import LedgerDataSource
from pybk.spark.sink import (BATCH_KEY, QUERY_KEY, LedgerStreamWriter, MicroBatchWritten,
                             stream_job_id, stream_tags, write_micro_batch_partition)
from pybk.spark.writer import LedgerWritten
import test_spark_source
from test_spark_source import PW, in_thread, payload, write_ledger

cluster = test_spark_source.cluster  # the fixture: etcd, 3 bookies and a client

ENTRIES, PER_BATCH, FAILING = 30, 10, 1  # batch FAILING fails once (in its last partition)


async def ledgers_tagged(bk, key: str, value: str) -> dict[int, dict[str, bytes]]:
    """{ledger_id: custom metadata} of every ledger whose custom metadata has key = value."""
    return {md.ledger_id: md.custom async for md in bk.store.ledgers.list_metadata()
            if md.custom.get(key) == value.encode()}


async def entries_of(bk, ledger_id: int) -> list[bytes]:
    lh = await bk.open_ledger(ledger_id, password=PW)
    return [e.data async for e in lh.read_entries(0, lh.last_add_confirmed)] if lh.last_add_confirmed >= 0 else []


@pytest.mark.timeout(720)  # two streaming runs; a loaded machine needs minutes for the first one
async def test_stream_restarted_after_a_failed_batch_stores_every_row_once(spark, cluster, tmp_path):
    """A streaming query whose batch fails in one task, started again from its checkpoint, stores
    every row of every batch once: no batch is lost, none is written twice.

    Slow: two streaming queries, each running micro-batches through Spark's Python workers
    (16 s on a quiet machine, 31 s at four test workers)."""
    uri, bk, _ = cluster
    source_ledger = (await write_ledger(bk, ENTRIES)).ledger_id
    marker = tmp_path / "failed-once"

    def fail_once(p):  # self-contained: Spark's Python workers cannot import this test module
        import os
        from pyspark import TaskContext
        ctx = TaskContext.get()
        if (ctx.getLocalProperty("streaming.sql.batchId") == str(FAILING) and ctx.partitionId() == 1
                and not os.path.exists(str(marker))):
            open(str(marker), "w").close()
            raise ValueError(f"injected failure in batch {FAILING}")
        return p

    def start():
        from pyspark.sql import functions as F
        df = (spark.readStream.format("pybk").option("metadataServiceUri", uri)
              .option("ledgers", str(source_ledger)).option("password", PW.decode())
              .option("maxEntriesPerTrigger", str(PER_BATCH)).option("entriesPerPartition", "5").load())
        return (df.select(F.udf(fail_once, BinaryType())("payload").alias("payload"))
                .writeStream.format("pybk").option("metadataServiceUri", uri)
                .option("password", PW.decode()).option("checkpointLocation", str(tmp_path / "ckpt"))
                .trigger(availableNow=True).start())

    async def run_once(expect_failure: bool):
        query = await in_thread(spark, start)
        try:
            if expect_failure:
                with pytest.raises(Exception, match=f"injected failure in batch {FAILING}"):
                    await in_thread(spark, query.awaitTermination, 300)
            else:
                assert await in_thread(spark, query.awaitTermination, 300) is True
        finally:
            await in_thread(spark, query.stop)  # a query that overran must not outlive the test
        return query.id

    query_id = await run_once(expect_failure=True)
    for batch in range(FAILING + 1):  # the batches before are committed; the failed one is undecided
        record = await bk.store.jobs.get(stream_job_id(query_id, batch))
        assert (record.outcome if record else None) is (JobOutcome.COMMITTED if batch < FAILING else None)
    # what a task attempt killed mid-write leaves behind: an open, pending ledger of the failed batch
    stray = await write_ledger(bk, 3, close=False, **stream_tags(query_id, FAILING, 1))
    assert await run_once(expect_failure=False) == query_id  # restarted from the same checkpoint

    batches = ENTRIES // PER_BATCH
    records = {b: await bk.store.jobs.get(stream_job_id(query_id, b)) for b in range(batches + 1)}
    assert records.pop(batches) is None
    assert all(r.outcome is JobOutcome.COMMITTED for r in records.values()), records
    tagged = await ledgers_tagged(bk, QUERY_KEY, query_id)
    assert set(tagged) == set().union(*(r.ledgers for r in records.values()))  # nothing pending left
    assert stray.ledger_id not in tagged
    assert {lid: state_of(c) for lid, c in tagged.items()} == {lid: WriteState.COMMITTED for lid in tagged}

    back = (spark.read.format("pybk").option("metadataServiceUri", uri).option("ledgers", "all")
            .option("password", PW.decode()).option("includeMetadata", "true").load())
    got: dict[int, list[bytes]] = {}
    for row in await in_thread(spark, back.collect):
        if row.ledger_metadata.get(QUERY_KEY) == query_id.encode():
            got.setdefault(int(row.ledger_metadata[BATCH_KEY]), []).append(bytes(row.payload))
    want = {b: sorted(payload(source_ledger, e) for e in range(b * PER_BATCH, (b + 1) * PER_BATCH))
            for b in range(batches)}
    assert {b: sorted(rows) for b, rows in got.items()} == want  # each batch's rows once: no dups, no gaps


def arrow(values: list[bytes]) -> list[pa.RecordBatch]:
    return [pa.record_batch([pa.array(values, pa.binary())], names=["payload"])]


async def test_a_batch_committed_in_pybk_is_not_written_twice_on_replay(cluster, caplog):
    uri, bk, _ = cluster
    opts = WriteOptions.parse({"metadataServiceUri": uri, "password": PW.decode()})
    query_id, batch = "5b0c3e0e-query", 7
    job_id = stream_job_id(query_id, batch)
    rows = [b"first %d" % i for i in range(20)]

    def task(values: list[bytes], partition: int) -> MicroBatchWritten:
        return run(write_micro_batch_partition(opts, "payload", iter(arrow(values)), partition, query_id, batch))

    def commit(messages: list[MicroBatchWritten | None]) -> None:
        LedgerStreamWriter(opts, "payload").commit(messages, batch)

    # attempt 1 writes and commits in pybk; Spark dies before recording the batch in its checkpoint
    first = await asyncio.to_thread(task, rows, 0)
    await asyncio.to_thread(commit, [first])
    decided = await bk.store.jobs.get(job_id)
    assert decided == JobRecord(job_id, JobOutcome.COMMITTED, frozenset({first.written.ledger_id}),
                                decided.time_ms)

    # attempt 2, the replay: a task that finds the batch decided deletes its own ledger ...
    late = await asyncio.to_thread(task, [b"second"], 1)
    assert late.written == LedgerWritten(1, None, 0)
    # ... and the commit of a task's ledger that got through is dropped in favour of attempt 1's
    lh = await bk.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, password=PW,
                                metadata=stream_tags(query_id, batch, 0))
    await lh.add_entry(b"second")
    await lh.close()
    with caplog.at_level(logging.WARNING, logger="pybk.spark"):
        await asyncio.to_thread(commit, [MicroBatchWritten(query_id, batch, LedgerWritten(0, lh.ledger_id, 1)),
                                         late])
    assert await bk.store.jobs.get(job_id) == decided
    assert set(await ledgers_tagged(bk, JOB_KEY, job_id)) == {first.written.ledger_id}
    kept = await bk.ledger_metadata(first.written.ledger_id)
    assert kept.custom[JOB_KEY] == job_id.encode() and state_of(kept.custom) is WriteState.COMMITTED
    assert await entries_of(bk, first.written.ledger_id) == rows
    assert any(f"batch {batch} was already committed in pybk" in r.getMessage()
               and str(lh.ledger_id) in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("options, overwrite, error", [
    ({"jobId": "mine"}, False, "option jobId is for batch writes: a stream names each micro-batch's job"),
    ({}, True, r"pybk ledgers are append-only: use outputMode\('append'\)"),
    ({"checkpointLocation": "/tmp/c", "queryName": "q", "ensembleSze": "3"}, False,
     "unknown option.*: ensemblesze;"),
])
def test_stream_writer_refuses_what_it_cannot_do_exactly_once(options, overwrite, error):
    source = LedgerDataSource({"metadataServiceUri": "etcd://127.0.0.1:1/nowhere", **options})
    with pytest.raises(OptionError, match=error):
        source.streamWriter(StructType([StructField("payload", BinaryType())]), overwrite)
