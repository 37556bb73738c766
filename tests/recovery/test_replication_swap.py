"""The replication worker's metadata change, with no server: a copied fragment names its new
bookie, unless the fragment changed while the copy ran."""
from __future__ import annotations

from pybk.meta.ledgers import Fragment, LedgerMetadata, LedgerState, Unchanged
from pybk.recovery.worker import swap_bookie


def ledger(*fragments: Fragment) -> LedgerMetadata:
    return LedgerMetadata(ledger_id=3, ensemble_size=3, write_quorum=2, ack_quorum=2, state=LedgerState.CLOSED,
                          last_entry_id=20, fragments=list(fragments), version=8)


def test_the_copied_fragment_names_the_target_in_the_lost_bookie_place():
    md = ledger(Fragment(0, ["a", "b", "c"]), Fragment(10, ["a", "b", "d"]))
    new = swap_bookie(1, 10, "b", "e")(md)
    assert new.fragments == [Fragment(0, ["a", "b", "c"]), Fragment(10, ["a", "e", "d"])]
    assert new.version == 8 and md.fragments[1].bookies == ["a", "b", "d"]


def test_a_fragment_that_changed_during_the_copy_is_left_alone():
    md = ledger(Fragment(0, ["a", "b", "c"]), Fragment(10, ["a", "b", "d"]))
    assert swap_bookie(2, 10, "b", "e")(md) == Unchanged()            # gone
    assert swap_bookie(1, 9, "b", "e")(md) == Unchanged()             # starts elsewhere
    assert swap_bookie(1, 10, "c", "e")(md) == Unchanged()            # lost already replaced
