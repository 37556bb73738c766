"""The protocol's pure decisions: write quorums, ordered acks, fencing coverage, recovery reads,
placement, the close-conflict rule and the read limit, with no server (write sets:
test_ledger_geometry)."""
from __future__ import annotations

import itertools
import random

import pytest

from pybk.client.close import CloseOutcome, after_close_conflict, close_at
from pybk.client.errors import NoSuchEntryError, NotEnoughBookiesError
from pybk.client.placement import choose_ensemble, replace_bookies
from pybk.client.quorum import (AckTracker, RecoveryDecision, ReplicaAnswer, fencing_complete, first_copies,
                                recovery_read_decision, validate, write_quorums)
from pybk.client.reader import check_range
from pybk.meta.ledgers import Fragment, LedgerMetadata, LedgerState, Unchanged

F, M, X = ReplicaAnswer.FOUND, ReplicaAnswer.MISSING, ReplicaAnswer.ERROR


def test_write_quorums_are_the_write_sets_from_each_index():
    assert write_quorums(3, 3) == [[0, 1, 2], [1, 2, 0], [2, 0, 1]]


def test_a_lone_adds_first_copies_go_to_idle_bookies_in_write_set_order():
    ws = [1, 2, 0]
    assert first_copies(ws, 2, [False, False, False]) == ([1, 2], [0])
    assert first_copies(ws, 2, [False, False, True]) == ([1, 0], [2])   # 2 answers a batch first
    assert first_copies(ws, 2, [True, True, False]) == ([2, 1], [0])
    assert first_copies(ws, 2, [True, True, True]) == ([1, 2], [0])
    assert first_copies([3, 4, 0], 1, [False, True, False, True, True]) == ([0], [3, 4])


def test_validate_rejects_bad_quorums():
    validate(3, 3, 2)
    for bad in [(2, 3, 2), (3, 2, 3), (3, 3, 0), (0, 0, 0)]:
        with pytest.raises(ValueError, match="ensemble >= write_quorum"):
            validate(*bad)


def test_entry_acked_only_with_ack_quorum_and_all_earlier_entries_acked():
    t = AckTracker(3, 3, 2)
    for _ in range(3):
        t.add()
    assert t.ack(1, 0) == -1 and t.ack(1, 1) == -1   # entry 1 has Qa, but 0 does not
    assert t.ack(0, 2) == -1
    assert t.ack(0, 0) == 1                           # 0 completes, 1 follows at once
    assert t.ack(2, 0) == 1
    assert t.ack(2, 0) == 1                           # a duplicate ack does not count twice
    assert t.ack(2, 1) == 2
    assert t.next_entry == 3 and list(t.pending) == []


def test_acks_outside_write_set_or_already_acked_are_ignored():
    t = AckTracker(4, 2, 2)
    t.add(); t.add()
    assert t.ack(0, 2) == -1 and t.acks(0) == set()   # index 2 is not in entry 0's write set {0,1}
    t.ack(0, 0); assert t.ack(0, 1) == 0
    assert t.ack(0, 1) == 0 and t.ack(7, 0) == 0


def test_acks_of_a_run_in_one_step_end_where_acks_one_by_one_do():
    rnd = random.Random(7)
    for e, qw, qa in [(3, 3, 2), (4, 2, 2), (5, 3, 2), (3, 2, 1)]:
        one, many = AckTracker(e, qw, qa), AckTracker(e, qw, qa)
        for _ in range(60):
            one.add(), many.add()
        for _ in range(40):  # runs as bookies answer them: any order, repeats, stale and unknown ids
            index = rnd.randrange(e)
            run = [rnd.randrange(-3, 66) for _ in range(rnd.randrange(1, 12))]
            for eid in run:
                one.ack(eid, index)
            assert many.ack_many(run, index) == one.lac
            assert many.lac == one.lac and many.pending == one.pending
            assert [many.acks(x) for x in many.pending] == [one.acks(x) for x in one.pending]


def test_forget_drops_acks_of_replaced_bookies():
    t = AckTracker(3, 3, 2)
    t.add(); t.add()
    t.ack(1, 0); t.ack(1, 2)
    t.forget([2])
    assert t.acks(1) == {0}
    t.ack(0, 0); assert t.ack(0, 1) == 0              # 1 lost its second ack, stays pending
    assert t.ack(1, 2) == 1


def test_fencing_needs_qw_minus_qa_plus_one_from_every_write_quorum():
    assert not fencing_complete(3, 3, 2, [0])
    assert fencing_complete(3, 3, 2, [0, 2])
    assert fencing_complete(3, 2, 2, [0])  is False
    # E5/Qw3/Qa2: every quorum of three needs two answers
    for answered in itertools.combinations(range(5), 3):
        ok = all(sum(i in answered for i in q) >= 2 for q in write_quorums(5, 3))
        assert fencing_complete(5, 3, 2, answered) is ok
    assert fencing_complete(5, 3, 2, range(5))
    assert fencing_complete(3, 3, 3, [1])             # Qa = Qw: one answer per quorum suffices


def test_recovery_read_decision():
    assert recovery_read_decision(3, 2, []) is RecoveryDecision.UNDECIDED
    assert recovery_read_decision(3, 2, [M, F]) is RecoveryDecision.EXISTS
    assert recovery_read_decision(3, 2, [M]) is RecoveryDecision.UNDECIDED
    assert recovery_read_decision(3, 2, [M, M]) is RecoveryDecision.MISSING
    assert recovery_read_decision(3, 2, [M, X]) is RecoveryDecision.UNDECIDED
    assert recovery_read_decision(3, 2, [M, X, X]) is RecoveryDecision.FAILED
    assert recovery_read_decision(3, 3, [M]) is RecoveryDecision.MISSING
    assert recovery_read_decision(3, 1, [M, M, X]) is RecoveryDecision.FAILED


def test_ensemble_is_distinct_random_and_spread_across_zones():
    zones = {f"b{i}": f"z{i % 3}" for i in range(9)}
    rng = random.Random(1)
    seen = set()
    for _ in range(50):
        ens = choose_ensemble(zones, 3, rng=rng)
        assert len(set(ens)) == 3
        assert {zones[b] for b in ens} == {"z0", "z1", "z2"}
        seen.add(tuple(sorted(ens)))
    assert len(seen) > 5
    nozone = {f"b{i}": None for i in range(4)}
    assert len(set(choose_ensemble(nozone, 4, rng=rng))) == 4


def test_not_enough_bookies_says_needed_and_found():
    with pytest.raises(NotEnoughBookiesError, match="needed 3, found 2") as ei:
        choose_ensemble({"a": None, "b": None}, 3)
    assert (ei.value.needed, ei.value.found) == (3, 2)
    with pytest.raises(NotEnoughBookiesError, match="needed 1, found 0"):
        replace_bookies({"a": None, "b": None, "c": None}, ["a", "b", "c"], [1])


def test_close_conflict_decision():
    assert after_close_conflict(LedgerState.OPEN, -1, 5) is CloseOutcome.RETRY
    assert after_close_conflict(LedgerState.IN_RECOVERY, -1, 5) is CloseOutcome.IN_RECOVERY
    assert after_close_conflict(LedgerState.CLOSED, 5, 5) is CloseOutcome.SUCCESS
    assert after_close_conflict(LedgerState.CLOSED, 6, 5) is CloseOutcome.MISMATCH
    with pytest.raises(ValueError):
        after_close_conflict("WEIRD", 0, 0)


def _ledger(state: LedgerState = LedgerState.OPEN, last_entry_id: int = -1) -> LedgerMetadata:
    return LedgerMetadata(ledger_id=7, ensemble_size=3, write_quorum=3, ack_quorum=2, state=state,
                          last_entry_id=last_entry_id, fragments=[Fragment(0, ["a", "b", "c"])], version=4)


def test_close_closes_an_open_ledger_at_our_last_entry_and_length():
    closed = close_at(5, 600)(_ledger())
    assert closed.state is LedgerState.CLOSED and (closed.last_entry_id, closed.length) == (5, 600)
    assert closed.version == 4                             # CASed against the version read


def test_close_leaves_a_ledger_someone_else_moved_with_the_outcome_as_reason():
    assert close_at(5, 600)(_ledger(LedgerState.IN_RECOVERY)) == Unchanged(CloseOutcome.IN_RECOVERY)
    assert close_at(5, 600)(_ledger(LedgerState.CLOSED, 5)) == Unchanged(CloseOutcome.SUCCESS)
    assert close_at(5, 600)(_ledger(LedgerState.CLOSED, 6)) == Unchanged(CloseOutcome.MISMATCH)


def test_a_handle_reads_from_entry_0_up_to_its_limit_and_no_further():
    check_range(7, 0, 5, limit=5, closed=False)
    with pytest.raises(NoSuchEntryError, match="entry ids start at 0"):
        check_range(7, -1, 5, limit=5, closed=False)
    with pytest.raises(NoSuchEntryError, match="its last add confirmed is 5"):
        check_range(7, 0, 6, limit=5, closed=False)
    with pytest.raises(NoSuchEntryError, match="its last entry is 5"):
        check_range(7, 0, 6, limit=5, closed=True)
