"""Typed client errors; each message says what happened and to which ledger or bookie."""
from __future__ import annotations

from pybk.client.bookie_client import BookieError, Status


def status_of(exc: BaseException) -> Status | None:
    """The status a bookie answered with, if `exc` is a bookie's answer (BookieError); None for
    any other failure (a timeout, no connection yet)."""
    return exc.code if isinstance(exc, BookieError) else None


class BKError(Exception):
    """Base of every error the ledger client raises."""


class InvalidLedgerConfigError(BKError, ValueError):
    """Ensemble, write quorum and ack quorum must satisfy E >= Qw >= Qa >= 1."""


class InsecureLedgerError(BKError, ValueError):
    """With security on, a ledger must have a password: the empty one gives it a master key anyone
    can compute."""


class LedgerFencedError(BKError):
    """The ledger was fenced by a recovering reader: this writer may no longer add.

    Like a timeout, it does not say whether the failed add was stored: only the
    recovered ledger does."""


class LedgerClosedError(BKError):
    """The ledger is closed; nothing more can be added to it."""


class LedgerRecoveryError(BKError):
    """Recovery could not finish (not enough bookies answered); the ledger stays IN_RECOVERY
    and opening it with recovery again retries."""


class NotEnoughBookiesError(BKError):
    """Placement found fewer writable bookies than it needs."""

    def __init__(self, needed: int, found: int, detail: str = ""):
        self.needed = needed
        self.found = found
        super().__init__(f"not enough writable bookies: needed {needed}, found {found}"
                         + (f" ({detail})" if detail else ""))


class UnauthorizedError(BKError):
    """Wrong password for the ledger (metadata check) or wrong master key (bookie check)."""


class AccessDeniedError(BKError):
    """A bookie refused this client's credential: none or an unknown one, or a role too low for
    the operation (see docs/security.md). Not a failed bookie: every bookie would refuse alike,
    so there is no retry and no ensemble change. The message names the bookie and the cause."""


class DigestMismatchError(BKError):
    """An entry failed its digest check on every replica that returned it."""


class NoSuchLedgerError(BKError, LookupError):
    """The ledger does not exist in metadata (a LookupError, as the metadata store's own, so that
    code below the client can tell a gone ledger without knowing the client)."""

    def __init__(self, ledger_id: int):
        self.ledger_id = ledger_id
        super().__init__(f"ledger {ledger_id} does not exist")


class NoSuchEntryError(BKError):
    """The entry does not exist (or is beyond what this handle may read)."""


class BookieUnavailableError(BKError):
    """A bookie could not be reached, or too few bookies answered for the operation."""
