"""Read options of the `pybk` data source that a Kafka-source user expects, on a real cluster
(etcd + 3 bookie processes) and local[2] Spark: per-ledger offsets, failOnDataLoss,
minPartitions, selection by custom metadata, the ledger columns, passwords/onUnauthorized,
a wrong etcd prefix, errors with the cause first, and IN planned per value."""
from __future__ import annotations

import asyncio
import datetime
import json
import subprocess
import sys
import threading
from functools import partial

import pytest
from polling import eventually
from test_spark_source import PW, bookie_reads, cluster, in_thread, payload, rows_of, source, write_ledger

from pybk.spark.session import activate

assert cluster  # the cluster fixture, shared with test_spark_source


def expected(lh, entries) -> list[tuple[int, int, bytes]]:
    return [(lh.ledger_id, e, payload(lh.ledger_id, e)) for e in entries]


class Collector:
    """A foreachBatch sink that keeps each batch's rows by batch id (a replay replaces its batch)."""

    def __init__(self):
        self.batches: dict[int, list[tuple[int, int, bytes]]] = {}
        self.lock = threading.Lock()

    def __call__(self, batch_df, batch_id):
        rows = rows_of(batch_df)
        with self.lock:
            self.batches[batch_id] = rows

    def rows(self) -> list[tuple[int, int, bytes]]:
        with self.lock:
            return sorted(r for rows in self.batches.values() for r in rows)


def start_stream(spark, uri: str, ledgers: str, sink: Collector, checkpoint, trigger: dict, **options):
    r = (spark.readStream.format("pybk").option("metadataServiceUri", uri).option("ledgers", ledgers)
         .option("password", PW.decode()))
    for k, v in options.items():
        r = r.option(k, str(v))
    return (r.load().writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint))
            .trigger(**trigger).start())


async def test_per_ledger_starting_and_ending_offsets_pick_each_ledgers_entries(spark, cluster, tmp_path):
    uri, bk, _ = cluster
    a, b, c = await write_ledger(bk, 30), await write_ledger(bk, 20), await write_ledger(bk, 10)
    ids = f"{a.ledger_id},{b.ledger_id},{c.ledger_id}"
    df = source(spark, uri, ids, startingOffsets=json.dumps({a.ledger_id: 10, b.ledger_id: -1}),
                endingOffsets=json.dumps({a.ledger_id: 15, c.ledger_id: -1}))
    # a: 10..14 (ending is exclusive); b: latest, so nothing; c: not named, so earliest to latest
    assert await in_thread(spark, rows_of, df) == expected(a, range(10, 15)) + expected(c, range(10))
    words = source(spark, uri, ids, startingOffsets="latest", endingOffsets="latest")
    assert await in_thread(spark, rows_of, words) == []
    # a stream: offsets for the ledgers named, earliest for the others, and endingOffsets caps it
    sink = Collector()
    query = await in_thread(spark, partial(start_stream, spark, uri, ids, sink, tmp_path / "ckpt", {"availableNow": True},
                                           startingOffsets=json.dumps({a.ledger_id: 25, b.ledger_id: -1}),
                                           endingOffsets=json.dumps({c.ledger_id: 4})))
    await in_thread(spark, query.awaitTermination, 180)
    assert sink.rows() == expected(a, range(25, 30)) + expected(c, range(4))
    with pytest.raises(Exception, match="startEntry and startingOffsets"):
        await in_thread(spark, source(spark, uri, ids, startEntry=1, startingOffsets="latest").collect)
    with pytest.raises(Exception, match=r"option endingOffsets: '\{12: 1\}' is not"):
        await in_thread(spark, source(spark, uri, ids, endingOffsets="{12: 1}").collect)


async def _stream_across_a_deletion(spark, cluster, tmp_path, fail_on_data_loss: bool):
    """A stream over an open ledger and a closed one; the closed one is deleted under it."""
    uri, bk, _ = cluster
    live = await write_ledger(bk, 5, close=False)
    doomed = await write_ledger(bk, 8)
    sink = Collector()
    query = await in_thread(spark, partial(start_stream, spark, uri, f"{live.ledger_id}-", sink, tmp_path / "ckpt",
                                           {"processingTime": "200 milliseconds"},
                                           failOnDataLoss=str(fail_on_data_loss).lower()))
    await eventually(lambda: len(sink.rows()) == 13, timeout=120, what="the first 13 rows")
    assert sink.rows() == expected(live, range(5)) + expected(doomed, range(8))
    await bk.delete_ledger(doomed.ledger_id, password=PW)
    return query, live, doomed, sink


async def test_fail_on_data_loss_stops_a_stream_whose_ledger_was_deleted(spark, cluster, tmp_path):
    query, live, doomed, sink = await _stream_across_a_deletion(spark, cluster, tmp_path, True)
    try:
        error = await eventually(query.exception, timeout=120, what="the query to fail")
        text = str(error)
        assert f"data loss: ledger {doomed.ledger_id} was deleted" in text.splitlines()[0]
        assert "failOnDataLoss=false" in text
        assert sink.rows() == expected(live, range(5)) + expected(doomed, range(8))  # nothing lost before
    finally:
        await in_thread(spark, query.stop)
        await live.close()


async def test_without_fail_on_data_loss_a_deleted_ledger_is_skipped_and_the_stream_goes_on(spark, cluster, tmp_path):
    query, live, doomed, sink = await _stream_across_a_deletion(spark, cluster, tmp_path, False)
    try:
        await asyncio.gather(*(live.add_entry_async(payload(live.ledger_id, e)) for e in range(5, 12)))
        await eventually(lambda: len(sink.rows()) == 13 + 7 or query.exception(), timeout=120,
                         what="the entries added after the deletion")
        assert query.exception() is None and query.isActive
        assert sink.rows() == expected(live, range(12)) + expected(doomed, range(8))
    finally:
        await in_thread(spark, query.stop)
        await live.close()


async def test_min_partitions_splits_ranges_into_at_least_that_many(spark, cluster):
    uri, bk, _ = cluster
    a, b = await write_ledger(bk, 40), await write_ledger(bk, 3)
    df = source(spark, uri, f"{a.ledger_id},{b.ledger_id}", minPartitions=6)
    assert df.rdd.getNumPartitions() >= 6
    assert await in_thread(spark, rows_of, df) == expected(a, range(40)) + expected(b, range(3))
    assert source(spark, uri, f"{a.ledger_id},{b.ledger_id}").rdd.getNumPartitions() == 2


async def test_ledgers_are_selected_by_custom_metadata_and_streams_pick_up_new_matches(spark, cluster, tmp_path):
    uri, bk, _ = cluster
    o1 = await write_ledger(bk, 3, stream=b"orders")
    o2 = await write_ledger(bk, 4, stream=b"orders", region=b"eu")
    p = await write_ledger(bk, 5, stream=b"payments", region=b"eu")
    await write_ledger(bk, 2)  # no custom metadata
    orders = source(spark, uri, "metadata.stream=orders")
    assert await in_thread(spark, rows_of, orders) == expected(o1, range(3)) + expected(o2, range(4))
    either = source(spark, uri, "metadata.stream=orders,metadata.stream=payments")
    assert await in_thread(spark, rows_of, either) == expected(o1, range(3)) + expected(o2, range(4)) + expected(p, range(5))
    both = source(spark, uri, "metadata.stream=orders,metadata.region=eu")
    assert await in_thread(spark, rows_of, both) == expected(o2, range(4))
    sink = Collector()
    query = await in_thread(spark, start_stream, spark, uri, "metadata.stream=orders", sink, tmp_path / "ckpt",
                            {"processingTime": "200 milliseconds"})
    try:
        await eventually(lambda: len(sink.rows()) == 7, timeout=120, what="the orders ledgers")
        o3 = await write_ledger(bk, 6, stream=b"orders")
        await write_ledger(bk, 6, stream=b"payments")
        await eventually(lambda: len(sink.rows()) >= 13, timeout=120, what="the new orders ledger")
        assert sink.rows() == expected(o1, range(3)) + expected(o2, range(4)) + expected(o3, range(6))
    finally:
        await in_thread(spark, query.stop)


async def test_rows_carry_the_ledger_ctime_and_its_text_metadata(spark, cluster):
    uri, bk, _ = cluster
    lh = await write_ledger(bk, 2, stream=b"orders", raw=b"\xff\xfe")
    md = await bk.ledger_metadata(lh.ledger_id)
    rows = await in_thread(spark, source(spark, uri, str(lh.ledger_id), includeMetadata="true").collect)
    ctime = datetime.datetime.fromtimestamp(md.ctime_ms / 1000, datetime.timezone.utc)
    assert md.ctime_ms > 0 and len(rows) == 2
    for r in rows:
        assert r.ledger_ctime.astimezone(datetime.timezone.utc) == ctime
        assert r.ledger_properties == {"stream": "orders"}                   # \xff\xfe is not UTF-8
        assert r.ledger_metadata == {"stream": b"orders", "raw": b"\xff\xfe"}
    plain = await in_thread(spark, source(spark, uri, str(lh.ledger_id)).collect)
    assert [r.ledger_ctime.astimezone(datetime.timezone.utc) for r in plain] == [ctime, ctime]


async def test_passwords_by_ledger_or_selector_and_on_unauthorized(spark, cluster):
    uri, bk, _ = cluster
    mine = await write_ledger(bk, 3)
    ops = await bk.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, password=b"ops-pw", metadata={"team": b"ops"})
    other = await bk.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, password=b"other-pw")
    for lh in (ops, other):
        for e in range(2):
            await lh.add_entry(payload(lh.ledger_id, e))
        await lh.close()
    with pytest.raises(Exception) as failed:
        await in_thread(spark, source(spark, uri, "all").collect)
    first = str(failed.value).splitlines()[0]
    assert f"wrong password for ledger(s) {ops.ledger_id}, {other.ledger_id}" in first, first
    assert "onUnauthorized=skip" in str(failed.value)
    skipped = source(spark, uri, "all", onUnauthorized="skip")
    assert await in_thread(spark, rows_of, skipped) == expected(mine, range(3))
    passwords = json.dumps({"metadata.team=ops": "ops-pw", str(other.ledger_id): "other-pw"})
    every = source(spark, uri, "all", passwords=passwords)
    assert await in_thread(spark, rows_of, every) == (expected(mine, range(3)) + expected(ops, range(2))
                                                     + expected(other, range(2)))


async def test_a_wrong_etcd_prefix_is_an_error_naming_it(spark, cluster):
    uri, bk, _ = cluster
    await write_ledger(bk, 1)
    wrong = uri.rsplit("/", 1)[0] + "/nope"
    with pytest.raises(Exception) as failed:
        await in_thread(spark, source(spark, wrong, "all").collect)
    assert f"no pybk cluster at {wrong}" in str(failed.value).splitlines()[0]

    def listledgers(metadata_uri: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pybk.cli", "shell", "listledgers", "--metadata-uri",
                               metadata_uri], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    res = await asyncio.to_thread(listledgers, wrong)
    assert res.returncode == 1 and f"no pybk cluster at {wrong}" in res.stderr and "Traceback" not in res.stderr
    ok = await asyncio.to_thread(listledgers, uri)
    assert ok.returncode == 0 and "no ledgers" not in ok.stdout


async def test_a_wrong_password_error_names_the_cause_on_its_first_line(spark, cluster, capsys):
    from pybk.spark.jobs import stats_main
    uri, bk, _ = cluster
    lh = await write_ledger(bk, 2)
    df = (spark.read.format("pybk").option("metadataServiceUri", uri).option("ledgers", str(lh.ledger_id))
          .option("password", "not-it").load())
    with pytest.raises(Exception) as failed:
        await in_thread(spark, df.collect)
    first = str(failed.value).splitlines()[0]
    assert f"wrong password for ledger(s) {lh.ledger_id}" in first, first
    assert "Traceback" not in str(failed.value)
    capsys.readouterr()

    def job():
        activate(spark)
        return stats_main(["-m", uri, "--ledgers", str(lh.ledger_id), "--password", "not-it"])
    assert await asyncio.to_thread(job) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"ledger_stats: wrong password for ledger(s) {lh.ledger_id}: give it with option password "
                   "or passwords (JSON by ledger id or metadata.KEY=VALUE selector), or set onUnauthorized=skip "
                   "to read the other ledgers"]


@pytest.mark.skipif(not hasattr(__import__("pyspark.sql.datasource").sql.datasource, "EqualTo"),
                    reason="Python data source filter pushdown needs Spark 4.1+")
async def test_in_on_entry_id_reads_only_those_entries(spark, cluster):
    uri, bk, procs = cluster
    a, b = await write_ledger(bk, 1600), await write_ledger(bk, 1510)
    df = source(spark, uri, f"{a.ledger_id},{b.ledger_id}").where("entry_id IN (5, 1500)")
    before = await asyncio.to_thread(bookie_reads, procs)
    got = await in_thread(spark, rows_of, df)
    read = await asyncio.to_thread(bookie_reads, procs) - before
    assert got == expected(a, (5, 1500)) + expected(b, (5, 1500))
    assert 4 <= read <= 8, f"bookies served {read} entries for 4 entries named by IN"
