"""Values the client hands to applications."""
from __future__ import annotations

from typing import NamedTuple


class LedgerEntry(NamedTuple):
    """One entry read from a ledger."""

    ledger_id: int
    entry_id: int
    data: bytes
