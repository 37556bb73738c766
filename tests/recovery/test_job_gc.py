"""The write-job garbage collector (pybk.meta.job_gc) through `pybk shell gc-jobs` and the elected
autorecovery auditor, on real etcd and bookies: what jobs leave behind is settled by their record."""
from __future__ import annotations

import json
import subprocess
import sys

from polling import eventually

from pybk.client import BookKeeper
from pybk.meta.jobs import JobOutcome, JobRecord
from pybk.meta import job_commit as commit
from pybk.spark import written_ledgers

PW = b"job-pw"


def shell_json(*args) -> dict | list:
    res = subprocess.run([sys.executable, "-m", "pybk.cli", "shell", *map(str, args), "-o", "json"],
                         capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


async def job_ledger(bk, job: str, partition: int, entries: int = 3, close: bool = True) -> int:
    """A ledger as a job's task writes it: pending, tagged with the job."""
    lh = await bk.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, password=PW,
                                metadata=commit.pending_tags(job, partition))
    for i in range(entries):
        await lh.add_entry(b"%s %d" % (job.encode(), i))
    if close:
        await lh.close()
    return lh.ledger_id


async def test_gc_jobs_settles_jobs_by_their_records_and_deletes_undecided_ones_only_after_the_grace(
        bookies, metadata_uri):
    bookies(3)
    async with await BookKeeper.connect(metadata_uri) as bk:
        store = bk.store
        crashed = await job_ledger(bk, "job-crashed", 0, close=False)   # its driver died: never decided
        done = [await job_ledger(bk, "job-done", p) for p in (0, 1)]
        lost = await job_ledger(bk, "job-done", 1)                      # an attempt that lost
        await store.jobs.decide(JobRecord("job-done", JobOutcome.COMMITTED, frozenset(done)))  # then crashed
        plain = (await bk.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, password=PW)).ledger_id

        listed = shell_json("listledgers", "--job", "job-done", "--metadata-uri", metadata_uri)
        assert [(r["ledger_id"], r["job"]["partition"], r["job"]["state"], r["job"]["visible"]) for r in listed] \
            == [(done[0], 0, "pending", True), (done[1], 1, "pending", True), (lost, 1, "pending", False)]

        dry = shell_json("gc-jobs", "--grace", 0, "--dry-run", "--metadata-uri", metadata_uri)
        assert dry["deleted"] == sorted([crashed, lost]) and dry["committed"] == done
        assert await store.jobs.get("job-crashed") is None and await store.ledgers.exists(lost)

        before = shell_json("gc-jobs", "--grace", 3600, "--metadata-uri", metadata_uri)
        assert before["deleted"] == [lost] and before["committed"] == done and before["kept"] == [crashed]
        for lid in done:
            assert commit.state_of((await store.ledgers.get(lid)).custom) is commit.WriteState.COMMITTED
        assert await store.ledgers.exists(crashed) and await store.jobs.get("job-crashed") is None

        after = shell_json("gc-jobs", "--grace", 0, "--retention", 0, "--metadata-uri", metadata_uri)
        assert after["deleted"] == [crashed] and after["aborted_jobs"] == ["job-crashed"]
        assert not await store.ledgers.exists(crashed)
        assert (await store.jobs.get("job-crashed")).outcome is JobOutcome.ABORTED  # a late driver's commit fails
        assert after["removed_records"] == ["job-done"]  # settled and old enough; the new abort stays
        assert written_ledgers(metadata_uri, "job-done") == {0: done[0], 1: done[1]}  # from the tags now
        assert sorted([lid async for lid in bk.list_ledgers()]) == sorted([*done, plain])


async def test_the_autorecovery_auditor_deletes_the_ledgers_of_a_job_that_never_decided(
        bookies, metadata_uri, autorecovery):
    bookies(3)
    async with await BookKeeper.connect(metadata_uri) as bk:
        crashed = await job_ledger(bk, "job-gone", 0)
        autorecovery(job_gc_interval=0.3, job_gc_grace=2)
        autorecovery(job_gc_interval=0.3, job_gc_grace=2)

        async def collected():
            return not await bk.store.ledgers.exists(crashed)
        await eventually(collected, timeout=60, what=f"autorecovery deleting ledger {crashed}")
        assert (await bk.store.jobs.get("job-gone")).outcome is JobOutcome.ABORTED
