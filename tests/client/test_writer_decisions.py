"""The writer's and recovery's pure decisions, with no server: how a failed add is answered,
which ensemble replaces failed bookies, and the metadata changes the update loop applies."""
from __future__ import annotations

import pytest

from pybk.client.bookie_client import BookieError, BookieUnavailableError, Status
from pybk.client.ensemble_change import append_fragment, next_ensemble, not_open_error, with_fragment
from pybk.client.errors import LedgerClosedError, LedgerFencedError, NotEnoughBookiesError, status_of
from pybk.client.reaction import Reaction, reaction
from pybk.client.recovery import close_recovered, to_recovery
from pybk.meta.ledgers import Fragment, LedgerMetadata, LedgerState, Unchanged

WRITABLE = {"a": None, "b": None, "c": None, "d": None, "e": None}


def ledger(state: LedgerState = LedgerState.OPEN, last_entry_id: int = -1, length: int = 0,
           fragments: list[Fragment] | None = None) -> LedgerMetadata:
    return LedgerMetadata(ledger_id=9, ensemble_size=3, write_quorum=3, ack_quorum=2, state=state,
                          last_entry_id=last_entry_id, length=length, version=11,
                          fragments=fragments or [Fragment(0, ["a", "b", "c"])])


def test_fencing_and_refusals_stop_the_writer_back_pressure_resends_anything_else_replaces_the_bookie():
    assert reaction(Status.FENCED) is Reaction.FENCED
    assert reaction(Status.UNAUTHORIZED) is Reaction.UNAUTHORIZED
    assert reaction(Status.BAD_REQUEST) is Reaction.REFUSED
    assert reaction(Status.TOO_MANY_REQUESTS) is Reaction.RESEND_LATER
    assert reaction(Status.ENTRY_EXISTS) is Reaction.EXISTS
    for status in (Status.IO_ERROR, Status.READ_ONLY, Status.NO_LEDGER, Status.NO_ENTRY, None):
        assert reaction(status) is Reaction.REPLACE_BOOKIE


def test_status_of_reads_a_bookie_answer_and_nothing_else():
    assert status_of(BookieError(Status.FENCED, "fenced", "b:1")) is Status.FENCED
    assert status_of(BookieUnavailableError("down", "b:1")) is Status.IO_ERROR
    assert status_of(TimeoutError()) is None
    assert status_of(LedgerFencedError("x")) is None


def test_next_ensemble_replaces_only_the_failed_indices_with_new_bookies():
    md = ledger()
    for _ in range(20):
        new = next_ensemble(md, {1}, WRITABLE, exclude={"d"})
        assert new[0] == "a" and new[2] == "c" and new[1] == "e"


def test_next_ensemble_needs_enough_bookies_outside_the_ensemble_and_exclusions():
    with pytest.raises(NotEnoughBookiesError):
        next_ensemble(ledger(), {0, 1}, WRITABLE, exclude={"d"})


def test_with_fragment_appends_or_replaces_a_last_fragment_that_starts_at_the_same_entry():
    md = ledger(fragments=[Fragment(0, ["a", "b", "c"]), Fragment(5, ["a", "d", "c"])])
    assert with_fragment(md, 7, ["a", "d", "e"]).fragments[-1] == Fragment(7, ["a", "d", "e"])
    assert len(with_fragment(md, 7, ["a", "d", "e"]).fragments) == 3
    replaced = with_fragment(md, 5, ["a", "e", "c"])
    assert replaced.fragments == [Fragment(0, ["a", "b", "c"]), Fragment(5, ["a", "e", "c"])]
    assert md.fragments[-1] == Fragment(5, ["a", "d", "c"])     # the input is not changed


def test_ensemble_change_appends_a_fragment_at_the_first_unacked_entry_of_an_open_ledger():
    new = append_fragment(4, {2}, WRITABLE, exclude={"d"})(ledger())
    assert new.fragments[0] == Fragment(0, ["a", "b", "c"])
    assert new.fragments[1] == Fragment(4, ["a", "b", "e"])
    assert new.version == 11


@pytest.mark.parametrize("state", [LedgerState.IN_RECOVERY, LedgerState.CLOSED])
def test_ensemble_change_leaves_a_ledger_that_is_no_longer_open_with_its_state_as_reason(state):
    assert append_fragment(4, {2}, WRITABLE)(ledger(state)) == Unchanged(state)


def test_a_writer_finding_its_ledger_closed_or_in_recovery_fails_closed_or_fenced():
    assert isinstance(not_open_error(ledger(LedgerState.CLOSED, 3)), LedgerClosedError)
    assert isinstance(not_open_error(ledger(LedgerState.IN_RECOVERY)), LedgerFencedError)


def test_recovery_moves_only_an_open_ledger_to_in_recovery():
    assert to_recovery(ledger()).state is LedgerState.IN_RECOVERY
    assert to_recovery(ledger(LedgerState.IN_RECOVERY)) == Unchanged(LedgerState.IN_RECOVERY)
    assert to_recovery(ledger(LedgerState.CLOSED, 3)) == Unchanged(LedgerState.CLOSED)


def test_recovery_closes_at_the_last_entry_found_unless_another_recovery_closed_first():
    closed = close_recovered(6, 700)(ledger(LedgerState.IN_RECOVERY, length=50))
    assert (closed.state, closed.last_entry_id, closed.length) == (LedgerState.CLOSED, 6, 700)
    kept = close_recovered(6, None)(ledger(LedgerState.IN_RECOVERY, length=50))
    assert kept.length == 50                                    # unknown length: the stored one stays
    assert close_recovered(6, 700)(ledger(LedgerState.CLOSED, 5)) == Unchanged(LedgerState.CLOSED)
