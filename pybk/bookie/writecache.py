"""The write cache: entries added since the last checkpoint, in memory and readable."""
from __future__ import annotations


class WriteCache:
    """Entries by ledger then entry id, with a running entry count and byte count (what paces
    checkpoints), and each ledger's highest entry id (an explicit LAC is checked against it;
    finding it by scanning would cost a pass over the ledger's entries, on the event loop)."""

    __slots__ = ("ledgers", "bytes", "count", "_last")

    def __init__(self) -> None:
        self.ledgers: dict[int, dict[int, bytes]] = {}
        self.bytes = 0
        self.count = 0
        self._last: dict[int, int] = {}

    def put(self, ledger: int, entry: int, body: bytes) -> None:
        entries = self.ledgers.get(ledger)
        if entries is None:
            entries = self.ledgers[ledger] = {}
        old = entries.get(entry)
        if old is None:
            self.count += 1
            if entry > self._last.get(ledger, -1):
                self._last[ledger] = entry
        else:
            self.bytes -= len(old)
        entries[entry] = body
        self.bytes += len(body)

    def put_many(self, ledger: int, bodies: dict[int, bytes]) -> int:
        """put() every entry id -> body of one ledger; returns the bytes of bodies. The cache may
        keep the dict itself, so the caller hands it over. Adds call this once per ledger of a
        batch, not put() per entry.

        A rewritten entry (a recovery add) is counted once, but the body it replaces stays in the
        byte count until the next checkpoint starts a new cache: finding the replaced bodies would
        cost a lookup per entry on the hot path, and the count only paces checkpoints."""
        nbytes = sum(map(len, bodies.values()))
        if bodies:
            top = max(bodies)
            if top > self._last.get(ledger, -1):
                self._last[ledger] = top
        old = self.ledgers.get(ledger)
        if old is None:
            self.ledgers[ledger] = bodies
            self.count += len(bodies)
        else:
            before = len(old)
            old.update(bodies)
            self.count += len(old) - before
        self.bytes += nbytes
        return nbytes

    def drop_ledger(self, ledger: int) -> int:
        """Forget every entry of ledger; returns how many there were."""
        entries = self.ledgers.pop(ledger, None)
        self._last.pop(ledger, None)
        if not entries:
            return 0
        self.count -= len(entries)
        self.bytes -= sum(map(len, entries.values()))
        return len(entries)

    def get(self, ledger: int, entry: int) -> bytes | None:
        entries = self.ledgers.get(ledger)
        return entries.get(entry) if entries is not None else None

    def last_entry(self, ledger: int) -> int | None:
        """The highest entry id of `ledger` held here, None if none."""
        return self._last.get(ledger)

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
