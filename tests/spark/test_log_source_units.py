"""The pure parts of the log source and sink: options, the chunk decoder, partition cutting and
producer ids (no cluster, no Spark)."""
from __future__ import annotations

import struct

import numpy as np
import pytest

from pybk.log import codec
from pybk.spark.logoptions import LogReadOptions, LogWriteOptions, parse_logs
from pybk.spark.logscan import (ARROW_BATCH_BYTES, PREFETCH, Columns, decode_chunk, log_arrow_schema, log_schema,
                                pieces_of, projection, split_entries, sub_range)
from pybk.spark.logwriter import producer_id
from pybk.spark.options import OptionError

URI = "etcd://127.0.0.1:2379/pybk"


def test_log_options_parse_names_patterns_and_kafka_style_positions():
    sel = parse_logs("orders, refunds.*,audit")
    assert sel.names == ("orders", "audit") and sel.patterns == ("refunds.*",)
    assert sel.matches("refunds.eu") and sel.matches("orders") and not sel.matches("order")
    o = LogReadOptions.parse({"metadataServiceUri": URI, "log": "orders", "startingOffsets": '{"orders": 12}',
                              "endingOffsets": "latest", "maxRecordsPerTrigger": "5", "cursor": "c1"})
    assert o.starting.of("orders") == 12 and o.starting.of("other") == -2 and o.max_records_per_trigger == 5
    assert o.cursor == "c1" and o.include_producer is None


@pytest.mark.parametrize("options, error", [
    ({"log": ""}, "option log is empty"),
    ({"log": "a(b"}, "neither a log name nor a valid pattern"),
    ({"log": "a", "startingOffsets": "earliest", "startingTimestamp": "5"}, "both say where reading starts"),
    ({"log": "a", "endingOffsets": '{"a": -2}'}, "earliest .* is not an ending position"),
    ({"log": "a", "startingOffsets": '{"a": "x"}'}, "is not an offset"),
    ({"log": "a", "includeProducer": "maybe"}, "must be auto, true or false"),
    ({"log": "a", "ledgers": "1"}, "unknown option.*ledgers"),
])
def test_log_options_refuse_what_they_cannot_do(options, error):
    with pytest.raises(OptionError, match=error):
        LogReadOptions.parse({"metadataServiceUri": URI, **options})


def test_write_options_need_one_log_name():
    assert LogWriteOptions.parse({"metadataServiceUri": URI, "log": "orders", "jobId": "j-1"}).job_id == "j-1"
    with pytest.raises(OptionError, match="is not a log name"):
        LogWriteOptions.parse({"metadataServiceUri": URI, "log": "a,b"})


def entries(spec: list[list[tuple[bytes, bytes | None, int]]], first: int = 0) -> tuple[bytes, list[int], list]:
    bodies, index = [], first
    for recs in spec:
        bodies.append(codec.encode(recs, index, producer_id=7 if index else 0, first_sequence=100 + index if index
                                   else codec.NO_SEQUENCE))
        index += len(recs)
    bounds = np.cumsum([0] + [len(b) for b in bodies]).tolist()
    return b"".join(bodies), bounds, bodies


def test_a_chunk_decodes_to_the_records_codec_decodes_cut_to_the_offset_range():
    spec = [[(b"p%d-%d" % (e, i) * (i % 4), (b"k%d" % i) if i % 2 else None, 1000 + e * 10 + i) for i in range(n)]
            for e, n in enumerate([3, 1, 5, 4])]
    buf, bounds, bodies = entries(spec)
    want = [r for body in bodies for r in codec.decode(body).records(codec.decode(body).header.first_index + 50)]
    for lo, hi in ((50, 63), (52, 61), (54, 55), (60, 99)):
        cols = Columns("x", log_arrow_schema(True))
        cols.add_chunk(buf, bounds[:-1], bounds[1:], 50, lo, hi)
        batch = cols.batch()
        got = [(r["offset"], round(r["timestamp"].timestamp() * 1000), r["key"], r["payload"], r["producer_id"], r["sequence"])
               for r in batch.to_pylist()]
        assert got == [(r.offset, r.timestamp, r.key, r.payload, 7 if r.offset >= 53 else None,
                        100 + r.offset - 50 if r.offset >= 53 else None) for r in want if lo <= r.offset < hi]
        assert set(batch.column("log").to_pylist()) == {"x"}


def test_uniform_entries_decode_in_a_chunk_as_codec_decodes_them():
    """Entries of keyless records sharing a timestamp carry a length per record only (version 2):
    a chunk of them, beside a full one, gives the records codec.decode gives."""
    spec = [[(b"u%d" % i, None, 2000) for i in range(4)], [(b"k", b"key", 2001)], [(b"v" * 7, None, 2002)] * 3]
    buf, bounds, bodies = entries(spec)
    assert [codec.read_header(b).uniform for b in bodies] == [True, False, True]
    want = [r for body in bodies for r in codec.decode(body).records(codec.decode(body).header.first_index)]
    cols = Columns("x", log_arrow_schema(False))
    cols.add_chunk(buf, bounds[:-1], bounds[1:], 0, 0, 99)
    got = [(r["offset"], round(r["timestamp"].timestamp() * 1000), r["key"], r["payload"])
           for r in cols.batch().to_pylist()]
    assert got == [(r.offset, r.timestamp, r.key, r.payload) for r in want]
    bad = buf[:bounds[1] - 1]
    with pytest.raises(codec.CorruptEntryError, match="bytes of keys and payloads"):
        decode_chunk(bad, [0], [len(bad)])


@pytest.mark.parametrize("damage, error", [
    (lambda b: b[:30], "shorter than a record entry header"),
    (lambda b: b"XX" + b[2:], "does not start with a record entry header"),
    (lambda b: b[:4] + struct.pack(">I", 10**6) + b[8:], "claims 1000000 records"),
    (lambda b: b[:-1], "claim .* bytes of keys and payloads but"),
])
def test_a_hostile_entry_fails_naming_what_is_wrong(damage, error):
    buf, bounds, _ = entries([[(b"abc", b"k", 1), (b"de", None, 2)]])
    bad = damage(buf)
    with pytest.raises(codec.CorruptEntryError, match=error):
        decode_chunk(bad, [0], [len(bad)])


def test_partitions_are_cut_by_bytes_and_then_to_the_minimum_count():
    assert split_entries(0, 99, 1000.0, 25_000) == [(0, 24), (25, 49), (50, 74), (75, 99)]
    assert split_entries(10, 12, 1000.0, 1 << 30, 5) == [(10, 10), (11, 11), (12, 12)]
    assert pieces_of([100, 10], 4) == [3, 1] and pieces_of([1, 1], 5) == [1, 1]


def test_a_partition_reads_small_sub_ranges_first_then_batches_of_a_few_mib():
    full = ARROW_BATCH_BYTES // 65536
    sizes = [sub_range(65536.0, i) for i in range(PREFETCH + 2)]
    assert sizes == sorted(sizes) and sizes[0] == full // PREFETCH and sizes[PREFETCH - 1:] == [full] * 3
    assert [sub_range(float(64 << 20), i) for i in range(PREFETCH)] == [1] * PREFETCH   # huge entries: one each


def test_producer_ids_are_stable_positive_and_distinct_per_job_and_query():
    a, b = producer_id("job", "j1"), producer_id("query", "j1")
    assert a == producer_id("job", "j1") and a != b and 0 < a < 1 << 63 and 0 < b < 1 << 63


def _struct(ddl: str):
    """A StructType of 'name type[ not null], ...' (the few types used here; no JVM needed)."""
    from pyspark.sql import types as T
    kinds = {"string": T.StringType(), "long": T.LongType(), "int": T.IntegerType(), "binary": T.BinaryType(),
             "timestamp": T.TimestampType(), "timestamp_ntz": T.TimestampNTZType()}
    fields = []
    for item in ddl.split(", "):
        name, kind, *rest = item.split()
        fields.append(T.StructField(name, kinds[kind], nullable=rest != ["not", "null"]))
    return T.StructType(fields)


def test_a_narrower_schema_builds_only_its_columns_in_its_order():
    spec = [[(b"p%d" % i, (b"k%d" % i) if i % 2 else None, 1000 + i) for i in range(n)] for n in (3, 4)]
    buf, bounds, _ = entries(spec, first=50)
    full = Columns("x", projection(_struct(log_schema(True))))
    assert full.schema == log_arrow_schema(True)
    assert [f.name for f in full.schema if not f.nullable] == ["log", "offset", "timestamp", "payload"]
    full.add_chunk(buf, bounds[:-1], bounds[1:], 0, 51, 56)
    want = full.batch()
    for ddl in ("payload binary", "sequence long, payload binary, offset long", "key binary", "log string",
                "timestamp timestamp, producer_id long"):
        cols = Columns("x", projection(_struct(ddl)))
        cols.add_chunk(buf, bounds[:-1], bounds[1:], 0, 51, 56)
        got = cols.batch()
        assert got.schema.names == [f.split()[0] for f in ddl.split(", ")]
        assert all(a.equals(b) for a, b in zip(got.columns, want.select(got.schema.names).columns)), ddl


@pytest.mark.parametrize("ddl, error", [
    ("payload binary, ledger_id long", "'ledger_id' is not a column of a log scan"),
    ("payload string", "column payload is binary, not string"),
    ("offset int", "column offset is long, not int"),
    ("timestamp timestamp_ntz", "column timestamp is timestamp, not timestamp_ntz"),
    ("key binary not null", "column key may be null; declare it nullable"),
    ("payload binary, payload binary", "at most once"),
])
def test_a_schema_a_log_scan_cannot_fill_is_refused_naming_the_column(ddl, error):
    with pytest.raises(OptionError, match=error):
        projection(_struct(ddl))
