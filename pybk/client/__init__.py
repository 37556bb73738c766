"""The BookKeeper client: ledgers replicated to write quorums, fencing, recovery, ensemble changes.

    from pybk.client import BookKeeper, DigestType
    async with await BookKeeper.connect("etcd://127.0.0.1:2379/pybk") as bk:
        lh = await bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2, password=b"pw")
        await lh.add_entry(b"payload")
"""
from pybk.entry import DigestType

from .bookkeeper import BookKeeper, ClientOptions
from .errors import (AccessDeniedError, BKError, BookieUnavailableError, DigestMismatchError,
                     InsecureLedgerError, InvalidLedgerConfigError, LedgerClosedError, LedgerFencedError, LedgerRecoveryError,
                     NoSuchEntryError, NoSuchLedgerError, NotEnoughBookiesError, UnauthorizedError)
from .handle import LedgerHandle
from .types import EntryChunk, LedgerEntry

__all__ = ["AccessDeniedError", "BookKeeper", "ClientOptions", "DigestType", "EntryChunk", "LedgerHandle", "LedgerEntry",
           "BKError", "BookieUnavailableError", "DigestMismatchError", "InsecureLedgerError", "InvalidLedgerConfigError", "LedgerClosedError",
           "LedgerFencedError", "LedgerRecoveryError", "NoSuchEntryError",
           "NoSuchLedgerError", "NotEnoughBookiesError", "UnauthorizedError"]
