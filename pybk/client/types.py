"""Values the client hands to applications."""
from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import Iterator, NamedTuple


class LedgerEntry(NamedTuple):
    """One entry read from a ledger."""

    ledger_id: int
    entry_id: int
    data: bytes


@dataclass(frozen=True, slots=True)
class EntryChunk:
    """Consecutive entries first_entry_id, first_entry_id + 1, ... of one ledger, verified, with
    their payloads back to back in one buffer: entry i's payload is buffer[offsets[i]:offsets[i + 1]].
    What bulk readers take instead of one object per entry (an Arrow binary array is built from
    the buffer and offsets as they are)."""

    ledger_id: int
    first_entry_id: int
    buffer: bytes
    offsets: list[int]

    @classmethod
    def of_payloads(cls, ledger_id: int, first_entry_id: int, payloads: list[bytes]) -> "EntryChunk":
        return cls(ledger_id, first_entry_id, b"".join(payloads), [0, *accumulate(map(len, payloads))])

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def payloads(self) -> list[bytes]:
        buf, offs = self.buffer, self.offsets
        return [buf[offs[i]:offs[i + 1]] for i in range(len(offs) - 1)]

    def entries(self) -> Iterator[LedgerEntry]:
        lid, first = self.ledger_id, self.first_entry_id
        for i, data in enumerate(self.payloads()):
            yield LedgerEntry(lid, first + i, data)
