"""Batch writes through `df.write.format("pybk")` against a real cluster (etcd + 3 bookies) and
local[2] Spark: all-or-nothing commits, tasks that outlive an abort, the cluster's ledger
defaults, and the save modes pybk refuses."""
from __future__ import annotations

import asyncio
import concurrent.futures

import pytest
from polling import eventually

from pybk.meta import MetadataStore
from pybk.meta.cluster import LedgerDefaults
from pybk.meta.jobs import JobOutcome
from pybk.meta import job_gc as gc
from pybk.spark import written_ledgers
from pybk.meta.job_commit import WriteState, state_of
from pybk.spark.session import activate

PW = "write-pw"


@pytest.fixture
async def cluster(bookies, metadata_uri):
    procs = bookies(3)
    store = await MetadataStore.connect(metadata_uri)
    try:
        yield metadata_uri, store, procs
    finally:
        await store.close()


async def in_thread(spark, fn, *args):
    def call():
        activate(spark)
        return fn(*args)
    return await asyncio.to_thread(call)


def writer(frame, uri: str, job: str, **options):
    w = (frame.write.format("pybk").mode("append").option("metadataServiceUri", uri)
         .option("password", PW).option("jobId", job))
    for k, v in options.items():
        w = w.option(k, str(v))
    return w


def read_all(spark, uri: str) -> list[bytes]:
    activate(spark)
    df = (spark.read.format("pybk").option("metadataServiceUri", uri).option("ledgers", "all")
          .option("password", PW).load())
    return sorted(bytes(r.payload) for r in df.collect())


def named_error(spark, uri: str, ledger_id: int) -> str:
    """The error of reading one ledger by id (empty if it reads)."""
    activate(spark)
    try:
        (spark.read.format("pybk").option("metadataServiceUri", uri).option("ledgers", str(ledger_id))
         .option("password", PW).load().collect())
    except Exception as exc:
        return str(exc)
    return ""


async def job_ledgers(store, job: str) -> dict[int, WriteState | None]:
    return {md.ledger_id: state_of(md.custom) async for md in gc.tagged(store, job)}


def tagged_now(uri: str, job: str) -> dict[int, WriteState | None]:
    """job_ledgers from synchronous code that may run inside an event loop (a task's iterator)."""
    async def ask():
        async with await MetadataStore.connect(uri) as st:
            return await job_ledgers(st, job)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, ask()).result()


async def test_tasks_that_outlive_an_abort_leave_no_ledger_and_readers_never_see_their_rows(spark, cluster):
    uri, store, _ = cluster

    def fail_or_keep_writing(batches):  # self-contained: Spark's Python workers cannot import this module
        import time as t

        import pyarrow as pa
        from pyspark import TaskContext
        if TaskContext.get().partitionId() == 0:
            t.sleep(1.5)
            raise ValueError("injected failure in partition 0")
        rows = sum(b.num_rows for b in batches)
        for i in range(20):  # partition 1 is still writing its ledger when the job fails and aborts
            yield pa.RecordBatch.from_pylist([{"payload": b"late %d.%d" % (i, r)} for r in range(rows)])
            t.sleep(0.5)

    frame = spark.range(0, 200, numPartitions=2).mapInArrow(fail_or_keep_writing, "payload binary")
    with pytest.raises(Exception, match="injected failure in partition 0"):
        await in_thread(spark, writer(frame, uri, "job-late").save)
    record = await store.jobs.get("job-late")
    assert record is not None and record.outcome is JobOutcome.ABORTED and not record.ledgers

    async def none_left():
        left = await job_ledgers(store, "job-late")
        if left:  # a ledger of the aborted job exists right now: readers must not see its rows
            assert not [p for p in await in_thread(spark, read_all, spark, uri) if p.startswith(b"late")]
        return not left
    await eventually(none_left, timeout=90, interval=0.5, what="no ledger of the aborted job left")

    # an attempt of the same job that starts writing only now, long after the abort: its ledger is
    # pending (readers skip it) while it writes, and it deletes the ledger itself once closed
    from pybk.spark.options import WriteOptions
    from pybk.spark.runtime import run
    from pybk.spark.writer import _write_partition
    opts = WriteOptions.parse({"metadataServiceUri": uri, "password": PW, "jobId": "job-late",
                               "ensembleSize": 3, "writeQuorum": 2, "ackQuorum": 2})
    during: list = []

    def batches():
        import pyarrow as pa
        for i in range(3):
            yield pa.RecordBatch.from_pylist([{"payload": b"late %d" % i}] * 50)
            if i == 1:
                pending = tagged_now(uri, "job-late")
                during.append((pending, read_all(spark, uri), named_error(spark, uri, *pending)))
    result = await asyncio.to_thread(lambda: run(_write_partition(opts, "payload", batches(), 1)))
    assert result.ledger_id is None and result.entries == 0
    (pending, rows, error), = during
    assert list(pending.values()) == [WriteState.PENDING] and rows == []
    assert f"ledger {next(iter(pending))} is not committed: write job job-late" in error
    assert await job_ledgers(store, "job-late") == {}
    assert written_ledgers(uri, "job-late") == {}


async def test_a_write_commits_its_ledgers_at_once_with_the_clusters_ledger_defaults(spark, cluster):
    uri, store, _ = cluster
    await store.cluster.set_ledger_defaults(LedgerDefaults(2, 2, 1))
    rows = [b"row %d" % i for i in range(90)]
    df = spark.createDataFrame([(p,) for p in rows], "payload binary").repartition(3)
    await in_thread(spark, writer(df, uri, "job-ok").save)
    written = written_ledgers(uri, "job-ok")
    assert sorted(written) == [0, 1, 2]
    assert (await store.jobs.get("job-ok")).ledgers == frozenset(written.values())
    for lid in written.values():
        md = await store.ledgers.get(lid)
        assert (md.ensemble_size, md.write_quorum, md.ack_quorum) == (2, 2, 1)
        assert state_of(md.custom) is WriteState.COMMITTED and md.is_closed
    assert await in_thread(spark, read_all, spark, uri) == sorted(rows)

    with pytest.raises(Exception, match="option jobId: job job-ok was already committed"):
        await in_thread(spark, writer(df, uri, "job-ok").save)

    def decided_meanwhile(batches):  # as the garbage collector does to a job past its grace
        import asyncio as aio

        from pybk.meta import MetadataStore
        from pybk.meta.jobs import JobOutcome, JobRecord

        async def abort() -> None:
            async with await MetadataStore.connect(uri) as st:
                await st.jobs.decide(JobRecord("job-overtaken", JobOutcome.ABORTED))
        aio.run(abort())
        yield from batches
    overtaken = df.mapInArrow(decided_meanwhile, "payload binary")
    with pytest.raises(Exception, match="pybk write job job-overtaken was already aborted"):
        await in_thread(spark, writer(overtaken, uri, "job-overtaken", ensembleSize=3).save)
    assert await job_ledgers(store, "job-overtaken") == {}
    assert await in_thread(spark, read_all, spark, uri) == sorted(rows)

    # Spark refuses every mode but append and overwrite before pybk is asked (its message, not ours)
    for mode in ("error", "ignore"):
        with pytest.raises(Exception, match=r"UNSUPPORTED_DATA_SOURCE_SAVE_MODE.*\"pybk\""):
            await in_thread(spark, writer(df, uri, f"job-{mode}").mode(mode).save)
        assert await store.jobs.get(f"job-{mode}") is None
    with pytest.raises(Exception, match=r"append-only: use mode\('append'\)"):
        await in_thread(spark, writer(df, uri, "job-overwrite").mode("overwrite").save)
    assert [lid async for lid in store.ledgers.list()] == sorted(written.values())


async def test_listledgers_shows_a_crashed_jobs_pending_ledgers_with_their_job_and_state(cluster):
    import json
    import subprocess
    import sys

    from pybk.client import BookKeeper
    from pybk.meta.job_commit import pending_tags
    uri, store, _ = cluster
    async with await BookKeeper.connect(uri) as bk:
        plain = await bk.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, password=PW.encode())
        crashed = await bk.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, password=PW.encode(),
                                         metadata=pending_tags("crashed-job", 3))   # what a killed task leaves

    def listledgers(*extra: str) -> str:
        res = subprocess.run([sys.executable, "-m", "pybk.cli", "shell", "listledgers", "--metadata-uri", uri, *extra],
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        return res.stdout
    rows = {r["ledger_id"]: r for r in json.loads(await asyncio.to_thread(listledgers, "-o", "json"))}
    assert rows[crashed.ledger_id]["job"] == {"id": "crashed-job", "partition": 3, "state": "pending",
                                              "outcome": "undecided"}
    assert "job" not in rows[plain.ledger_id]
    table = {line.split()[0]: line for line in (await asyncio.to_thread(listledgers)).splitlines()[1:]}
    assert table[str(crashed.ledger_id)].endswith("crashed-job p3 pending (undecided)")
    assert table[str(plain.ledger_id)].rstrip().endswith("-")
