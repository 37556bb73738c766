"""Per-ledger state a bookie keeps: master key, fenced flag, LAC and the long-polls waiting on it;
the decisions made from it, and what a journal record says of it.

The fence/WriteLac key check is a pure function here; the add path makes the same decisions
(adds.decide), once per ledger run of a batch, because it is the hot path.

A bookie records the first master key it accepts for a ledger. That first key (for a ledger the
bookie does not know, or knows only from keyless recovery adds) is accepted only when it matches
the ledger's metadata (`admit_new_key`): nobody can claim an id that is not allocated, nor lock
the owner out by writing first with a key of their own. Keyless requests (an empty key) are
recovery adds and fences of an admin (autorecovery); they record no key.
"""
from __future__ import annotations

import asyncio
import hmac
import struct
import time
from dataclasses import dataclass, field
from typing import Callable

from pybk.entry import HEADER, HEADER_SIZE, key_check
from pybk.proto import pb

from .journal import RecordType

_STATE = struct.Struct(">BBqq")


@dataclass
class LedgerState:
    """What a bookie knows about one ledger. `lac` is the max LAC seen in entry headers,
    `explicit_lac` the last WriteLac; the bookie's LAC is the larger of the two."""

    master_key: bytes = b""
    fenced: bool = False
    lac: int = -1
    explicit_lac: int = -1
    deleted: bool = False
    dirty: bool = field(default=True, compare=False)

    @property
    def last_add_confirmed(self) -> int:
        return max(self.lac, self.explicit_lac)

    def to_bytes(self) -> bytes:
        return _STATE.pack(int(self.fenced), int(self.deleted), self.lac, self.explicit_lac) + self.master_key

    @classmethod
    def from_bytes(cls, data: bytes) -> "LedgerState":
        fenced, deleted, lac, explicit = _STATE.unpack_from(data)
        return cls(master_key=bytes(data[_STATE.size:]), fenced=bool(fenced), lac=lac,
                   explicit_lac=explicit, deleted=bool(deleted), dirty=False)


# add_batch's answer for entries whose ledger must first be looked up in the metadata (an
# admission check said LOOKUP); never sent: the service looks it up and adds them again
LOOKUP = -1
KEY_MISSING = ("master key missing: only recovery adds and fences of an admin (keyless recovery) "
               "may omit the ledger's key")


def check_key(state: LedgerState | None, master_key: bytes, keyless: bool = False) -> int:
    """Status for a fence or WriteLac: the master key must match the recorded one, if any. An
    empty key is BAD_REQUEST unless `keyless` (the caller may do keyless recovery)."""
    if not master_key:
        return pb.OK if keyless else pb.BAD_REQUEST
    if state is not None and state.master_key and state.master_key != master_key:
        return pb.UNAUTHORIZED
    return pb.OK


def needs_admission(state: LedgerState | None, master_key: bytes) -> bool:
    """Whether a request's key would be the first key this bookie records for the ledger (it
    knows no key for it), so that it must be checked against the metadata first."""
    return bool(master_key) and (state is None or not state.master_key)


@dataclass(frozen=True)
class LedgerKeys:
    """What the metadata says to verify a ledger's master key with: `key_check` (ledgers created
    now), else the legacy stored `master_key`; neither: any key is accepted (ledgers of releases
    that stored nothing)."""

    key_check: bytes = b""
    master_key: bytes = b""


def admit_new_key(ledger: int, master_key: bytes, keys: LedgerKeys | None) -> tuple[int, str]:
    """(status, why not) for the first key a bookie would record for `ledger`; `keys` is None
    when the ledger is not in the metadata."""
    if keys is None:
        return pb.UNAUTHORIZED, (f"ledger {ledger} is not allocated in the metadata: a bookie accepts keys only "
                                 f"for existing ledgers")
    if keys.key_check:
        ok = hmac.compare_digest(key_check(master_key), keys.key_check)
    elif keys.master_key:
        ok = hmac.compare_digest(master_key, keys.master_key)
    else:
        ok = True
    if ok:
        return pb.OK, ""
    return pb.UNAUTHORIZED, f"wrong master key for ledger {ledger}: it does not match the ledger's metadata"



def apply_record(st: LedgerState, rtype: int, entry: int, body: bytes) -> None:
    """What one journal record says of its ledger's state: an ADD carries a LAC in its entry
    header, MASTER_KEY the key, FENCE the fence, LAC an explicit LAC. Replay and the index
    rebuild read records alike through here."""
    if rtype == _ADD:
        if len(body) >= HEADER_SIZE:
            lac = HEADER.unpack_from(body)[2]
            if lac > st.lac:
                st.lac = lac
    elif rtype == _MASTER_KEY:
        st.master_key = body
    elif rtype == _FENCE:
        st.fenced = True
    elif rtype == _LAC:
        st.explicit_lac = max(st.explicit_lac, entry)


_ADD, _MASTER_KEY, _FENCE, _LAC = (int(RecordType.ADD), int(RecordType.MASTER_KEY), int(RecordType.FENCE),
                                   int(RecordType.LAC))
STATE_RECORDS = (_MASTER_KEY, _LAC, _FENCE)  # the records that carry ledger state and no entry


class LacWaiters:
    """Long-polls waiting for a ledger's LAC to pass a value (ReadLac with LONG_POLL)."""

    def __init__(self) -> None:
        self._waiters: dict[int, list[asyncio.Future]] = {}

    def __contains__(self, ledger: int) -> bool:
        return ledger in self._waiters

    async def wait(self, ledger: int, previous: int, lac: Callable[[], int | None], timeout: float) -> int | None:
        """As soon as lac() (the ledger's LAC, None if unknown) passes `previous`, it; at timeout
        the current one."""
        current = lac()
        if current is not None and current > previous:
            return current
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return lac()
            fut = loop.create_future()
            self._waiters.setdefault(ledger, []).append(fut)
            # a timer settles the future at the deadline: awaited directly, a wake resumes this
            # call in the next turn of the loop, before the journal's fdatasync that the same add
            # queued (asyncio.wait_for would take a turn more)
            timer = loop.call_later(remaining, _settle, fut)
            try:
                await fut
            finally:
                timer.cancel()
                waiters = self._waiters.get(ledger)
                if waiters is not None:
                    if fut in waiters:
                        waiters.remove(fut)
                    if not waiters:
                        del self._waiters[ledger]
            current = lac()
            if current is not None and current > previous:
                return current

    def wake(self, ledger: int) -> None:
        """The ledger's LAC rose (or the ledger is gone): every long-poll on it looks again."""
        for fut in self._waiters.pop(ledger, ()):
            _settle(fut)


def _settle(fut: asyncio.Future) -> None:
    """Let a long-poll look at the LAC again (woken, or at its deadline)."""
    if not fut.done():
        fut.set_result(None)
