"""What a writer's close does after losing its metadata CAS (DESIGN §2), as a pure decision."""
from __future__ import annotations

import enum


class CloseOutcome(enum.Enum):
    RETRY = "retry"              # still OPEN (someone else changed e.g. an ensemble): CAS again
    SUCCESS = "success"          # already CLOSED at exactly our last entry: the close is done
    IN_RECOVERY = "in_recovery"  # a reader is recovering the ledger: the writer has been fenced
    MISMATCH = "mismatch"        # CLOSED at another last entry: our view of the ledger is wrong


def after_close_conflict(state: str, closed_last_entry: int, our_last_entry: int) -> CloseOutcome:
    """Decide from the re-read metadata (`state` is a LedgerState name)."""
    if state == "OPEN":
        return CloseOutcome.RETRY
    if state == "IN_RECOVERY":
        return CloseOutcome.IN_RECOVERY
    if state == "CLOSED":
        return CloseOutcome.SUCCESS if closed_last_entry == our_last_entry else CloseOutcome.MISMATCH
    raise ValueError(f"unknown ledger state {state!r}")
