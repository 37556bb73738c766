"""The commit rules of write jobs (pybk.meta.job_commit): pure functions, no Spark, no cluster."""
from __future__ import annotations

import pytest

from pybk.entry import DigestType
from pybk.meta.jobs import JobOutcome, JobRecord
from pybk.meta.ledgers import Fragment, LedgerMetadata, Unchanged
from pybk.meta import job_commit as commit
from pybk.meta.job_commit import GcAction, WriteState

PENDING = commit.pending_tags("job-1", 4)
COMMITTED = JobRecord("job-1", JobOutcome.COMMITTED, frozenset({10, 11}))
ABORTED = JobRecord("job-1", JobOutcome.ABORTED)
STREAM = commit.pending_tags("job-1", 4, {commit.QUERY_KEY: "q-1", commit.BATCH_KEY: "7"})
HOUR = 3_600_000


def test_pending_tags_name_the_job_partition_and_pending_state_and_keep_extra_tags():
    tags = commit.pending_tags("job-1", 4, {"pybk.spark.query": "q"})
    assert tags == {"pybk.spark.job": b"job-1", "pybk.spark.partition": b"4",
                    "pybk.spark.state": b"pending", "pybk.spark.query": b"q"}
    assert commit.job_of(tags) == "job-1" and commit.partition_of(tags) == 4
    assert commit.state_of(tags) is WriteState.PENDING
    assert commit.job_of({"app": b"x"}) is None and commit.partition_of({}) == -1
    assert commit.partition_of({commit.PARTITION_KEY: b"x"}) == -1


def test_a_pending_ledger_is_visible_only_once_its_jobs_record_lists_it():
    assert commit.needs_record(PENDING)
    assert not commit.visible(10, PENDING, None)                 # undecided
    assert not commit.visible(10, PENDING, ABORTED)
    assert not commit.visible(12, PENDING, COMMITTED)            # an attempt that lost
    assert commit.visible(10, PENDING, COMMITTED)
    other = JobRecord("job-2", JobOutcome.COMMITTED, frozenset({10}))
    assert not commit.visible(10, PENDING, other)                # another job's record never counts


def test_ledgers_not_written_by_jobs_or_already_committed_are_visible_without_a_record():
    committed = {**PENDING, commit.STATE_KEY: b"committed"}
    legacy = {commit.JOB_KEY: b"job-0", commit.PARTITION_KEY: b"1"}  # written before the protocol
    for custom in ({}, {"app": b"x"}, committed, legacy):
        assert not commit.needs_record(custom) and commit.visible(10, custom, None)
    unknown = {**PENDING, commit.STATE_KEY: b"half-done"}
    assert commit.state_of(unknown) is WriteState.PENDING and not commit.visible(10, unknown, None)


def test_a_late_attempt_keeps_its_ledger_only_while_undecided_or_when_committed_with_it():
    assert commit.late_attempt_keeps(12, None)
    assert commit.late_attempt_keeps(10, COMMITTED)
    assert not commit.late_attempt_keeps(12, COMMITTED)
    assert not commit.late_attempt_keeps(10, ABORTED)


@pytest.mark.parametrize("ledger, custom, record, age, action", [
    (10, {"app": b"x"}, None, 10 * HOUR, GcAction.KEEP),                  # not a job's ledger
    (10, {**PENDING, commit.STATE_KEY: b"committed"}, None, 10 * HOUR, GcAction.KEEP),
    (10, PENDING, None, HOUR - 1, GcAction.KEEP),                          # undecided, within the grace
    (10, PENDING, None, HOUR, GcAction.DELETE),                            # undecided past the grace
    (10, PENDING, COMMITTED, 0, GcAction.COMMIT),                          # listed: finish the commit
    (12, PENDING, COMMITTED, 0, GcAction.DELETE),                          # an attempt that lost
    (10, PENDING, ABORTED, 0, GcAction.DELETE),
    (10, STREAM, None, 10 * HOUR, GcAction.KEEP),                          # a batch its query will replay
    (10, STREAM, COMMITTED, 0, GcAction.COMMIT),
    (12, STREAM, COMMITTED, 0, GcAction.DELETE),
])
def test_gc_action(ledger, custom, record, age, action):
    now = 100 * HOUR
    assert commit.gc_action(ledger, custom, now - age, record, now, HOUR) is action


def test_mark_committed_changes_only_the_state_of_a_pending_ledger():
    md = LedgerMetadata(ledger_id=10, ensemble_size=3, write_quorum=2, ack_quorum=2,
                        digest_type=DigestType.CRC32C, password_hash=b"", ctime_ms=1,
                        custom={**PENDING, "app": b"x"}, fragments=[Fragment(0, ["a", "b", "c"])])
    marked = commit.mark_committed(md)
    assert not isinstance(marked, Unchanged)
    assert marked.custom == {**PENDING, "app": b"x", commit.STATE_KEY: b"committed"}
    assert commit.mark_committed(marked) == Unchanged(WriteState.COMMITTED)
    assert commit.mark_committed(md.replace(custom={"app": b"x"})) == Unchanged(None)
