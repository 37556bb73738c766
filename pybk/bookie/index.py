"""The LMDB index: where each checkpointed entry is, and each ledger's durable state.

db `locations`: key (ledger u64 BE, entry u64 BE) -> (dir u16, log id u32, offset u64).
db `ledgers`:   key ledger u64 BE -> LedgerState.to_bytes().
One environment per process; one write transaction per checkpoint.
"""
from __future__ import annotations

import struct
from pathlib import Path
from typing import Iterable, Iterator

import lmdb

KEY = struct.Struct(">QQ")
LEDGER_KEY = struct.Struct(">Q")
LOCATION = struct.Struct(">HIQ")


class Index:
    """LMDB environment with the `locations` and `ledgers` databases."""

    def __init__(self, directory: Path, map_size: int = 64 * 1024 ** 3, sync: bool = True):
        path = Path(directory) / "index"
        path.mkdir(parents=True, exist_ok=True)
        self.env = lmdb.open(str(path), map_size=map_size, max_dbs=4, sync=sync, metasync=sync,
                             readahead=False, max_readers=256)
        self.locations = self.env.open_db(b"locations")
        self.ledgers = self.env.open_db(b"ledgers")

    def commit(self, locations: list[tuple[bytes, bytes]], ledgers: Iterable[tuple[int, bytes]]) -> None:
        """Record packed (KEY, LOCATION) pairs and ledger states in one transaction."""
        lk = LEDGER_KEY.pack
        with self.env.begin(write=True) as txn:
            cur = txn.cursor(self.locations)
            cur.putmulti(locations)
            for ledger, state in ledgers:
                txn.put(lk(ledger), state, db=self.ledgers)

    def location(self, ledger: int, entry: int) -> tuple[int, int, int] | None:
        with self.env.begin(db=self.locations) as txn:
            v = txn.get(KEY.pack(ledger, entry))
        return LOCATION.unpack(v) if v is not None else None

    def entries(self, ledger: int, first: int = 0) -> Iterator[int]:
        """Entry ids of a ledger present in the index, in order, from `first`."""
        with self.env.begin(db=self.locations) as txn:
            cur = txn.cursor()
            if not cur.set_range(KEY.pack(ledger, max(first, 0))):
                return
            for k in cur.iternext(values=False):
                l, e = KEY.unpack(k)
                if l != ledger:
                    break
                yield e

    def last_entry(self, ledger: int) -> int | None:
        """The highest entry id of a ledger in the index, None if it has none."""
        with self.env.begin(db=self.locations) as txn:
            cur = txn.cursor()
            if cur.set_range(KEY.pack(ledger + 1, 0)):
                found = cur.prev()
            else:
                found = cur.last()
            if not found:
                return None
            l, e = KEY.unpack(cur.key())
        return e if l == ledger else None

    def live_locations(self, dir_index: int, log_ids: set[int]) -> dict[int, list[tuple[int, int, int]]]:
        """(ledger, entry, offset) of every indexed entry stored in the given logs of one dir."""
        out: dict[int, list[tuple[int, int, int]]] = {}
        unpack_key, unpack_loc = KEY.unpack, LOCATION.unpack
        with self.env.begin(db=self.locations) as txn:
            for k, v in txn.cursor():
                d, log_id, offset = unpack_loc(v)
                if d == dir_index and log_id in log_ids:
                    out.setdefault(log_id, []).append((*unpack_key(k), offset))
        return out

    def ledger_states(self) -> Iterator[tuple[int, bytes]]:
        with self.env.begin(db=self.ledgers) as txn:
            for k, v in txn.cursor():
                yield LEDGER_KEY.unpack(k)[0], bytes(v)

    def delete_ledgers(self, ledgers: Iterable[int]) -> int:
        """Drop the locations and state of ledgers in one transaction (garbage collection);
        returns how many locations were removed."""
        removed = 0
        with self.env.begin(write=True) as txn:
            cur = txn.cursor(self.locations)
            for ledger in sorted(ledgers):
                end = KEY.pack(ledger + 1, 0)
                if cur.set_range(KEY.pack(ledger, 0)):
                    while cur.key() and cur.key() < end:
                        if not cur.delete():
                            break
                        removed += 1
                txn.delete(LEDGER_KEY.pack(ledger), db=self.ledgers)
        return removed

    def close(self) -> None:
        self.env.close()
