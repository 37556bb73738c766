"""pybk's JVM reader of logs (pybk.spark.jvm) against a real cluster and local[2] Spark: it reads
what the Python reader reads, record for record, in every column and for every way a scan is
cut; it reads past a stopped bookie and a corrupt replica; and a striped log is handed to the
Python reader. The other log tests (test_spark_logs.py) run through it too: their sessions have
pybk's jar.
"""
from __future__ import annotations

import asyncio

import pytest
from test_spark_logs import PW, body, cluster, fill, in_thread, key, read  # noqa: F401 (cluster: a fixture)

from pybk.entry import DigestType
from pybk.log import LogConfig, Rollover, WriterOptions


def everything(df) -> list[tuple]:
    """Every column of every row, in a stable order."""
    return sorted(tuple(bytes(v) if isinstance(v, (bytes, bytearray)) else v for v in r) for r in df.collect())


def jvm_reads(df) -> bool:
    """Whether Spark's plan scans with pybk's JVM reader."""
    return "pybk log scan (JVM reader)" in df._jdf.queryExecution().executedPlan().toString()


@pytest.fixture
async def logs_of_every_kind(cluster):
    """Logs with keys and several segments, an idempotent producer's, uniform entries
    (append_many) and a MAC-signed one."""
    uri, bk, logs = cluster
    await fill(logs, "jvm.keys", 700, roll_every=250)
    await fill(logs, "jvm.producer", 90, producer=77)
    await logs.create("jvm.many", LogConfig(rollover=Rollover(max_bytes=None)), password=PW)
    async with await logs.open_writer("jvm.many", password=PW) as w:
        for chunk in range(3):
            await w.append_many([b"m%05d" % i + bytes(94) for i in range(chunk * 1000, chunk * 1000 + 1000)])
    await logs.create("jvm.mac", LogConfig(digest=DigestType.MAC, rollover=Rollover(max_bytes=None)), password=PW)
    async with await logs.open_writer("jvm.mac", password=PW) as w:
        for i in range(50):
            w.append_nowait(body("jvm.mac", i), key=key(i))
        await w.flush()
    return uri


CUTS = [
    {},
    {"startingOffsets": {"jvm.keys": 240, "jvm.many": 1500}, "endingOffsets": {"jvm.keys": 510, "jvm.many": 2999}},
    {"bytesPerPartition": "2000", "minPartitions": "7"},
    {"startingTimestamp": "0", "includeProducer": "true"},
]


async def test_the_jvm_reader_reads_what_the_python_reader_reads(spark, logs_of_every_kind):
    """Every way a scan is cut (whole, edges inside segments, small partitions, producer columns),
    each read by both readers, on one cluster."""
    uri = logs_of_every_kind
    for options in CUTS:
        opts = {"password": PW.decode(), **options}
        jvm = read(spark, uri, "jvm\\..*", **opts)
        python = read(spark, uri, "jvm\\..*", reader="python", **opts)
        assert jvm_reads(jvm) and not jvm_reads(python)
        got, want = await in_thread(spark, everything, jvm), await in_thread(spark, everything, python)
        assert got == want, options
        assert len(got) > 1000
        assert {r[0] for r in got} == {"jvm.keys", "jvm.producer", "jvm.many", "jvm.mac"}


async def test_a_narrower_schema_a_count_and_a_wrong_mac_password(spark, logs_of_every_kind):
    uri = logs_of_every_kind
    df = (spark.read.format("pybk").schema("payload binary not null, offset long not null")
          .option("metadataServiceUri", uri).option("log", "jvm.many").load())
    assert jvm_reads(df)
    got = await in_thread(spark, lambda: sorted((r.offset, bytes(r.payload)) for r in df.collect()))
    assert got == [(i, b"m%05d" % i + bytes(94)) for i in range(3000)]
    total = await in_thread(spark, lambda: df.selectExpr("count(*) AS n", "sum(length(payload)) AS b").first())
    assert (total.n, total.b) == (3000, 3000 * 100)
    wrong = read(spark, uri, "jvm.mac", password="not the password")
    with pytest.raises(Exception, match="MAC digest mismatch"):
        await in_thread(spark, wrong.collect)


async def test_the_jvm_reader_reads_past_a_stopped_bookie_and_a_corrupt_replica(spark, bookies, metadata_uri):
    """One of the three bookies stopped, then (started again) every copy it holds damaged on its
    disk: each scan still returns every record as written."""
    from entrylog_files import records

    from pybk.client import BookKeeper
    from pybk.log import Logs
    procs = bookies(3)
    async with await BookKeeper.connect(metadata_uri) as bk:
        logs = Logs(bk)
        await fill(logs, "jvm.faults", 400)
        seg = [s async for page in logs.meta.segments((await logs.ref("jvm.faults")).log_id) for s in page][0]
        md = await bk.ledger_metadata(seg.ledger_id)
    want = [("jvm.faults", i, key(i), body("jvm.faults", i)) for i in range(400)]

    def scan():
        df = read(spark, metadata_uri, "jvm.faults", bytesPerPartition="3000")
        assert jvm_reads(df)
        return sorted((r.log, r.offset, None if r.key is None else bytes(r.key), bytes(r.payload))
                      for r in df.collect())

    victim = next(p for p in procs if p.bookie_id == md.fragments[0].bookies[0])
    victim.stop()   # a clean stop checkpoints: every entry is in its entry logs
    assert await in_thread(spark, scan) == want
    damaged = 0
    for path in victim.ledger_dirs[0].rglob("*.log"):
        data = bytearray(path.read_bytes())
        for ledger, _, offset, length in records(path):
            if ledger == seg.ledger_id:
                data[offset + length - 1] ^= 0xFF
                damaged += 1
        path.write_bytes(bytes(data))
    assert damaged > 0
    victim.start()
    assert await in_thread(spark, scan) == want


async def test_a_striped_log_is_read_by_the_python_reader(spark, cluster):
    """Ensembles wider than the write quorum hold every entry on some bookies only: the JVM
    reader takes whole-copy ensembles, and the planner hands striped ones to Python."""
    uri, bk, logs = cluster
    await logs.create("jvm.striped", LogConfig(ensemble=3, write_quorum=2, ack_quorum=2), password=PW)
    async with await logs.open_writer("jvm.striped", password=PW, options=WriterOptions()) as w:
        for i in range(30):
            w.append_nowait(body("jvm.striped", i), key=key(i))
        await w.flush()
    df = read(spark, uri, "jvm.striped")
    got = await in_thread(spark, lambda: sorted((r.offset, bytes(r.payload)) for r in df.collect()))
    assert got == [(i, body("jvm.striped", i)) for i in range(30)]
    assert await in_thread(spark, df.count) == 30   # one column (offset) handed on


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
async def test_segments_the_bookies_dropped_under_a_planned_scan_are_data_loss(spark, bookies, metadata_uri,
                                                                                fail_on_data_loss):
    """A scan planned, then its first segments truncated away and collected by every bookie
    before it reads them: the scan fails naming the log and the offsets (failOnDataLoss), or
    returns the rest of the log without them."""
    from pybk.client import BookKeeper
    from pybk.log import Logs
    procs = bookies(3)
    async with await BookKeeper.connect(metadata_uri) as bk:
        logs = Logs(bk)
        await fill(logs, "jvm.lost", 300, roll_every=100)
        df = read(spark, metadata_uri, "jvm.lost", bytesPerPartition="1000",
                  failOnDataLoss=str(fail_on_data_loss).lower())
        planned = await in_thread(spark, lambda: df._jdf.queryExecution().toRdd())
        assert await in_thread(spark, planned.getNumPartitions) >= 3   # planned: its partitions are fixed
        assert await logs.truncate("jvm.lost", 200, password=PW) == 200
    for p in procs:
        result = await asyncio.to_thread(p.http_json, "/api/v1/bookie/gc", "POST")
        assert result["deleted_ledgers"], result
    if fail_on_data_loss:
        lost = r"data loss: log 'jvm.lost': offsets (0-99|100-199) \(segment ledger \d+\) were truncated away"
        with pytest.raises(Exception, match=lost):
            await in_thread(spark, planned.count)
    else:
        assert await in_thread(spark, planned.count) == 100
