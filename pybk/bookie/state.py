"""Per-ledger state a bookie keeps: master key, fenced flag, LAC; and the decisions made from it.

The fence/WriteLac key check is a pure function here; the add path makes the same decisions inline
(Bookie.add_batch), once per ledger run of a batch, because it is the hot path.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

from pybk.proto import pb

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


def check_key(state: LedgerState | None, master_key: bytes) -> int:
    """Status for a fence or WriteLac: the master key must match the recorded one, if any."""
    if not master_key:
        return pb.BAD_REQUEST
    if state is not None and state.master_key and state.master_key != master_key:
        return pb.UNAUTHORIZED
    return pb.OK

