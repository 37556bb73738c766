"""The write cache: entries added since the last checkpoint, in memory and readable."""
from __future__ import annotations


class WriteCache:
    """Entries by ledger then entry id, with a running byte count that triggers checkpoints."""

    __slots__ = ("ledgers", "bytes", "count")

    def __init__(self) -> None:
        self.ledgers: dict[int, dict[int, bytes]] = {}
        self.bytes = 0
        self.count = 0

    def put(self, ledger: int, entry: int, body: bytes) -> None:
        entries = self.ledgers.get(ledger)
        if entries is None:
            entries = self.ledgers[ledger] = {}
        old = entries.get(entry)
        if old is None:
            self.count += 1
        else:
            self.bytes -= len(old)
        entries[entry] = body
        self.bytes += len(body)

    def get(self, ledger: int, entry: int) -> bytes | None:
        entries = self.ledgers.get(ledger)
        return entries.get(entry) if entries is not None else None

    def entry_ids(self, ledger: int) -> list[int]:
        return list(self.ledgers.get(ledger, ()))

    def sorted_items(self, ledger_filter=None) -> list[tuple[int, int, bytes]]:
        """(ledger, entry, body) sorted by ledger then entry: the order the entry log wants."""
        out = []
        for ledger in sorted(self.ledgers):
            if ledger_filter is not None and not ledger_filter(ledger):
                continue
            entries = self.ledgers[ledger]
            out.extend((ledger, e, entries[e]) for e in sorted(entries))
        return out

    def merge_from(self, older: "WriteCache") -> None:
        """Put back entries of a failed checkpoint without overwriting newer ones."""
        for ledger, entries in older.ledgers.items():
            for e, body in entries.items():
                if self.get(ledger, e) is None:
                    self.put(ledger, e, body)

    def __len__(self) -> int:
        return self.count
