"""What a writer's close does with the metadata it finds (docs/protocol.md), as a pure decision: the
change the metadata update loop applies, asked again after every lost CAS."""
from __future__ import annotations

import enum

from pybk.meta.ledgers import Change, LedgerMetadata, LedgerState, Unchanged


class CloseOutcome(enum.Enum):
    RETRY = "retry"              # still OPEN (someone else changed e.g. an ensemble): CAS again
    SUCCESS = "success"          # already CLOSED at exactly our last entry: the close is done
    IN_RECOVERY = "in_recovery"  # a reader is recovering the ledger: the writer has been fenced
    MISMATCH = "mismatch"        # CLOSED at another last entry: our view of the ledger is wrong


def after_close_conflict(state: LedgerState, closed_last_entry: int, our_last_entry: int) -> CloseOutcome:
    """Decide from the (re-)read metadata's state and last entry."""
    if state is LedgerState.OPEN:
        return CloseOutcome.RETRY
    if state is LedgerState.IN_RECOVERY:
        return CloseOutcome.IN_RECOVERY
    if state is LedgerState.CLOSED:
        return CloseOutcome.SUCCESS if closed_last_entry == our_last_entry else CloseOutcome.MISMATCH
    raise ValueError(f"unknown ledger state {state!r}")


def close_at(last_entry: int, length: int) -> Change[CloseOutcome]:
    """The close as a metadata change: an OPEN ledger becomes CLOSED at `last_entry` with
    `length` bytes; anything else is left as it is, with the outcome as the reason."""
    def change(md: LedgerMetadata) -> LedgerMetadata | Unchanged[CloseOutcome]:
        outcome = after_close_conflict(md.state, md.last_entry_id, last_entry)
        if outcome is CloseOutcome.RETRY:
            return md.replace(state=LedgerState.CLOSED, last_entry_id=last_entry, length=length)
        return Unchanged(outcome)
    return change
