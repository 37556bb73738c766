"""Job records (store.jobs) and the cluster's ledger defaults (store.cluster) on a real etcd."""
from __future__ import annotations

import asyncio

import pytest

from pybk.meta.cluster import LedgerDefaults
from pybk.meta.errors import BadMetadataError
from pybk.meta.jobs import JobOutcome, JobRecord


async def test_a_job_is_decided_once_and_racing_deciders_all_get_the_first_decision(store, open_store):
    other = await open_store()
    wants = [JobRecord("job-a", JobOutcome.COMMITTED, frozenset({1, 2}), time_ms=5),
             JobRecord("job-a", JobOutcome.ABORTED, time_ms=6)] * 5
    got = await asyncio.gather(*((store if i % 2 else other).jobs.decide(w) for i, w in enumerate(wants)))
    assert len(set(got)) == 1 and got[0] in wants[:2]
    assert await store.jobs.get("job-a") == got[0] == await other.jobs.get("job-a")
    assert await store.jobs.get("job-b") is None


async def test_job_records_are_listed_in_id_order_across_pages_and_deleted_one_by_one(store):
    for i in (3, 1, 2):
        await store.jobs.decide(JobRecord(f"job-{i}", JobOutcome.ABORTED, time_ms=i))
    assert [r.job_id async for r in store.jobs.list(page_size=2)] == ["job-1", "job-2", "job-3"]
    assert await store.jobs.delete("job-2") and not await store.jobs.delete("job-2")
    assert [r.job_id async for r in store.jobs.list()] == ["job-1", "job-3"]
    with pytest.raises(BadMetadataError, match="bad job id 'a/b'"):
        await store.jobs.get("a/b")


async def test_ledger_defaults_are_stored_in_the_cluster_record_keeping_its_instance_id(store):
    assert await store.cluster.ledger_defaults() is None
    instance = await store.cluster.instance_id()
    await store.cluster.set_ledger_defaults(LedgerDefaults(2, 2, 1))
    assert await store.cluster.ledger_defaults() == LedgerDefaults(2, 2, 1)
    await asyncio.gather(*(store.cluster.set_ledger_defaults(LedgerDefaults(e, e, 1)) for e in (3, 4, 5)))
    assert (await store.cluster.ledger_defaults()).ensemble in (3, 4, 5)
    assert await store.cluster.instance_id() == instance
