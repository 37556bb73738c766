"""Values the client hands to applications."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, NamedTuple

import numpy as np


class LedgerEntry(NamedTuple):
    """One entry read from a ledger."""

    ledger_id: int
    entry_id: int
    data: bytes


@dataclass(frozen=True, slots=True)
class EntryChunk:
    """Consecutive entries first_entry_id, first_entry_id + 1, ... of one ledger, verified, with
    their payloads where they lie in one buffer: entry i's payload is buffer[starts[i]:ends[i]]
    (a bookie's answer as it came, headers between the payloads: verified in place, no payload
    copied). What bulk readers take instead of one object per entry: a reader that decodes the
    payloads works on the buffer; one that needs them back to back gathers them once (`packed`)."""

    ledger_id: int
    first_entry_id: int
    buffer: bytes | memoryview
    starts: np.ndarray      # int64
    ends: np.ndarray        # int64

    @classmethod
    def of_payloads(cls, ledger_id: int, first_entry_id: int, payloads: list[bytes]) -> "EntryChunk":
        sizes = np.fromiter(map(len, payloads), np.int64, len(payloads))
        ends = np.cumsum(sizes)
        return cls(ledger_id, first_entry_id, b"".join(payloads), ends - sizes, ends)

    def __len__(self) -> int:
        return len(self.starts)

    def payloads(self) -> list[bytes]:
        buf = self.buffer   # bytes(a slice of bytes) is that slice: a copy only of a view's
        return [bytes(buf[s:e]) for s, e in zip(self.starts.tolist(), self.ends.tolist())]

    def packed(self) -> tuple[bytes | memoryview, np.ndarray]:
        """(the payloads back to back, the int64 offsets where each starts and the last ends):
        the buffer itself when they already are, else gathered by one join."""
        sizes = self.ends - self.starts
        offsets = np.zeros(len(sizes) + 1, np.int64)
        np.cumsum(sizes, out=offsets[1:])
        if len(sizes) and not (self.starts[1:] != self.ends[:-1]).any():
            a, z = int(self.starts[0]), int(self.ends[-1])
            return (self.buffer if a == 0 and z == len(self.buffer) else self.buffer[a:z]), offsets
        mv = memoryview(self.buffer)
        return b"".join([mv[s:e] for s, e in zip(self.starts.tolist(), self.ends.tolist())]), offsets

    def entries(self) -> Iterator[LedgerEntry]:
        lid, first = self.ledger_id, self.first_entry_id
        for i, data in enumerate(self.payloads()):
            yield LedgerEntry(lid, first + i, data)
