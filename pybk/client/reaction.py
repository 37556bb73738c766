"""How the writer reacts to a bookie's answer to an add, as a pure decision on the typed status
(the handle's callback only carries it out)."""
from __future__ import annotations

import enum

from pybk.client.bookie_client import Status


class Reaction(enum.Enum):
    FENCED = "fenced"              # a recovery fenced the ledger: this writer may add no more
    UNAUTHORIZED = "unauthorized"  # the bookie refused the master key: so would every bookie
    DENIED = "denied"              # the bookie refused this client's credential: so would every bookie
    REFUSED = "refused"            # a bad request (e.g. too large): no ensemble change helps
    EXISTS = "exists"              # the bookie holds the entry with other bytes: another writer wrote it
    RESEND_LATER = "resend_later"  # back-pressure: send the same entry to the same bookie soon
    REPLACE_BOOKIE = "replace"     # the bookie failed (or gave no answer): change the ensemble


_REACTIONS = {Status.FENCED: Reaction.FENCED, Status.UNAUTHORIZED: Reaction.UNAUTHORIZED,
              Status.ACCESS_DENIED: Reaction.DENIED, Status.ENTRY_EXISTS: Reaction.EXISTS,
              Status.BAD_REQUEST: Reaction.REFUSED, Status.TOO_MANY_REQUESTS: Reaction.RESEND_LATER}


def reaction(status: Status | None) -> Reaction:
    """What a failed add with this status (None: no answer from a bookie, e.g. a broken
    connection) calls for."""
    return _REACTIONS.get(status, Reaction.REPLACE_BOOKIE)
