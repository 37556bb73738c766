"""The rows of the `pybk` data source: their Spark schema and the Arrow batches that carry them.

Every row is one entry: `ledger_id`, `entry_id`, `payload`, and `ledger_ctime` (when the ledger
was created, from its metadata's ctime_ms, so event-time work needs no payload parsing);
`includeMetadata` adds the ledger's custom metadata, as bytes (`ledger_metadata`) and as text
(`ledger_properties`: the values that decode as UTF-8). Columns that describe the ledger rather
than the entry are the same for every row of a partition, so they are built once per ledger.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import pyarrow as pa

BASE_SCHEMA = "ledger_id long, entry_id long, payload binary, ledger_ctime timestamp"
METADATA_SCHEMA = BASE_SCHEMA + ", ledger_metadata map<string,binary>, ledger_properties map<string,string>"
TIMESTAMP = pa.timestamp("us", tz="UTC")  # what PySpark expects of a timestamp column


def spark_schema(include_metadata: bool) -> str:
    """The DDL schema Spark sees."""
    return METADATA_SCHEMA if include_metadata else BASE_SCHEMA


def arrow_schema(include_metadata: bool) -> pa.Schema:
    """The Arrow schema of the batches handed to Spark (matches spark_schema)."""
    fields = [pa.field("ledger_id", pa.int64()), pa.field("entry_id", pa.int64()),
              pa.field("payload", pa.binary()), pa.field("ledger_ctime", TIMESTAMP)]
    if include_metadata:
        fields.append(pa.field("ledger_metadata", pa.map_(pa.string(), pa.binary())))
        fields.append(pa.field("ledger_properties", pa.map_(pa.string(), pa.string())))
    return pa.schema(fields)


def properties(custom: Mapping[str, bytes]) -> list[tuple[str, str]]:
    """The custom metadata values that are UTF-8 text, as text (the others are left out)."""
    out = []
    for k, v in sorted(custom.items()):
        try:
            out.append((str(k), bytes(v).decode("utf-8")))
        except UnicodeDecodeError:
            continue
    return out


class LedgerColumns:
    """The per-ledger columns of one partition's rows, built once from the ledger's metadata."""

    def __init__(self, md: Any, include_metadata: bool):
        self.ledger_id = int(md.ledger_id)
        self.ctime_us = int(getattr(md, "ctime_ms", 0) or 0) * 1000
        custom = getattr(md, "custom", None) or {}
        self.metadata = (sorted((str(k), bytes(v)) for k, v in custom.items())
                         if include_metadata else None)
        self.properties = properties(custom) if include_metadata else None
        self.schema = arrow_schema(include_metadata)

    def batch(self, entry_ids: Sequence[int] | pa.Array, payloads: Sequence[bytes] | pa.Array) -> pa.RecordBatch:
        """One Arrow batch: these entries with the ledger's columns repeated alongside."""
        n = len(entry_ids)
        cols = [pa.array([self.ledger_id] * n, pa.int64()),
                entry_ids if isinstance(entry_ids, pa.Array) else pa.array(entry_ids, pa.int64()),
                payloads if isinstance(payloads, pa.Array) else pa.array(payloads, pa.binary()),
                pa.array([self.ctime_us] * n, TIMESTAMP)]
        if self.metadata is not None:
            cols.append(pa.array([self.metadata] * n, pa.map_(pa.string(), pa.binary())))
            cols.append(pa.array([self.properties] * n, pa.map_(pa.string(), pa.string())))
        return pa.RecordBatch.from_arrays(cols, schema=self.schema)
