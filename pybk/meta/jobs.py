"""Job records `/<prefix>/jobs/<job id>`: the one atomic decision of a write job's outcome.

A job that writes many ledgers (a Spark write, one micro-batch of a streaming query) ends by
creating its record under a create-if-absent transaction: `committed` with the ids of the ledgers
that make up its output, or `aborted`. The record is written once and never changed, so every
party (the driver, late task attempts, readers, the garbage collector) agrees on the outcome by
reading one key. The rules that interpret it live in `pybk.meta.job_commit`.
"""
from __future__ import annotations

import enum
import json
import re
import time
from dataclasses import dataclass, field
from typing import AsyncIterator

from .errors import BadMetadataError
from .etcd import Etcd, cmp_create, op_get, op_put, prefix_end

JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


class JobOutcome(enum.StrEnum):
    """How a job ended: its listed ledgers are its output, or it has none."""

    COMMITTED = "committed"
    ABORTED = "aborted"


def check_job_id(job_id: str) -> str:
    """job_id, or BadMetadataError saying what a job id may contain."""
    if not JOB_ID.match(job_id or ""):
        raise BadMetadataError(f"bad job id {job_id!r}: use 1-200 letters, digits, '.', '_' or '-', "
                               "starting with a letter or digit")
    return job_id


@dataclass(frozen=True)
class JobRecord:
    """A job's decided outcome. `ledgers`: the committed output (empty when aborted)."""

    job_id: str
    outcome: JobOutcome
    ledgers: frozenset[int] = frozenset()
    time_ms: int = field(default_factory=lambda: int(time.time() * 1000))

    def to_bytes(self) -> bytes:
        return json.dumps({"job_id": self.job_id, "outcome": self.outcome.value,
                           "ledgers": sorted(self.ledgers), "time_ms": self.time_ms},
                          sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> "JobRecord":
        try:
            d = json.loads(data)
            return cls(job_id=str(d["job_id"]), outcome=JobOutcome(d["outcome"]),
                       ledgers=frozenset(int(i) for i in d.get("ledgers", ())),
                       time_ms=int(d.get("time_ms", 0)))
        except (ValueError, KeyError, TypeError) as exc:
            raise BadMetadataError(f"undecodable job record {data[:80]!r}: {exc!r}") from None


class Jobs:
    """`store.jobs`: create-once job records."""

    def __init__(self, etcd: Etcd, prefix: bytes):
        self.etcd = etcd
        self.dir = prefix + b"jobs/"

    def key(self, job_id: str) -> bytes:
        return self.dir + check_job_id(job_id).encode()

    async def decide(self, record: JobRecord) -> JobRecord:
        """Store record unless the job already has one; returns the stored record (this one, or
        the one that was there first: the outcome is decided exactly once)."""
        key = self.key(record.job_id)
        resp = await self.etcd.txn([cmp_create(key, 0)], [op_put(key, record.to_bytes())], [op_get(key)],
                                   what=f"decide job {record.job_id}")
        if resp.succeeded:
            return record
        return JobRecord.from_bytes(resp.responses[0].response_range.kvs[0].value)

    async def get(self, job_id: str) -> JobRecord | None:
        """The job's record, or None while it is undecided (or after its record was removed)."""
        kv = await self.etcd.get(self.key(job_id))
        return JobRecord.from_bytes(kv.value) if kv else None

    async def list(self, page_size: int = 500) -> AsyncIterator[JobRecord]:
        """Every job record, in job id order, page_size at a time."""
        start, end = self.dir, prefix_end(self.dir)
        while True:
            resp = await self.etcd.range(start, end, limit=page_size)
            for kv in resp.kvs:
                yield JobRecord.from_bytes(kv.value)
            if not resp.more or not resp.kvs:
                return
            start = resp.kvs[-1].key + b"\0"

    async def delete(self, job_id: str) -> bool:
        """Remove the record (garbage collection of old, fully committed jobs); True if it existed."""
        resp = await self.etcd.delete(self.key(job_id))
        return resp.deleted > 0
