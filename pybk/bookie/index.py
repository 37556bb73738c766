"""The LMDB index: where each checkpointed entry is, and each ledger's durable state.

db `locations`: key (ledger u64 BE, entry u64 BE) -> (dir u16, log id u32, offset u64).
db `ledgers`:   key ledger u64 BE -> LedgerState.to_bytes().
db `meta`:      b"journal" -> the id of the journal this index belongs to (journal.head);
                b"checkpoint" -> the journal mark (seq u64, offset u64) of the last checkpoint,
                written in the same transaction as that checkpoint's locations.
One environment per process; one write transaction per checkpoint.

Failure modes, checked by `inspect` before the bookie maps the file: `data.mdb` missing or empty
while the bookie holds data (a journal mark or entry logs exist); cut shorter than its own meta
pages say (mapping it would SIGBUS on the first access past the end); damaged pages (every
database is walked in a child process, so a crash there cannot take the bookie down); no
checkpoint record, or one older than the journal mark (a stale index); a journal id other than
the journal's (an index of another bookie or of an earlier life of this one). Each is an
IndexDamagedError naming the file and the rebuild command. The walk reads every page once per
start: 0.13 s for a million entries (a 40 MB file) in the page cache, else one read of the file. Not detected: an index that is intact and
current but lacks entries for another reason (the scrubber checks entries against it).
"""
from __future__ import annotations

import struct
import subprocess
import sys
from itertools import islice
from pathlib import Path
from typing import Iterable, Iterator

import lmdb
import numpy as np

KEY = struct.Struct(">QQ")
LEDGER_KEY = struct.Struct(">Q")
LOCATION = struct.Struct(">HIQ")
LOCATION_DTYPE = np.dtype([("disk", ">u2"), ("log", ">u4"), ("offset", ">u8")])  # LOCATION as numpy records
_KEY_DTYPE = np.dtype([("ledger", ">u8"), ("entry", ">u8")])
CHECKPOINT = struct.Struct(">QQ")
DATA_FILE = "data.mdb"
_JOURNAL, _CHECKPOINT = b"journal", b"checkpoint"
# LMDB's two meta pages (pages 0 and 1, little-endian on the machines we run on): page header
# 16 bytes, then magic u32, version u32, address, map size, two 48-byte db records (the first's
# md_pad is the page size), last page number u64, txn id u64.
_LMDB_MAGIC = 0xBEEFC0DE
_META = struct.Struct("<II")
_META_PSIZE = 40
_META_LAST = struct.Struct("<QQ")
_META_LAST_AT = 136


class IndexDamagedError(Exception):
    """The index is missing, cut, damaged or stale: start-up must stop (rebuild it)."""

    def __init__(self, path: Path, problem: str):
        self.path = path
        super().__init__(
            f"index {path} {problem}: stop the bookie and rebuild it with `pybk bookie --rebuild-index`.\n"
            f"Reads of checkpointed entries would be wrong. Run the rebuild with this bookie's --journal-dir and "
            f"--ledger-dir options (and --metadata-uri, to restore master keys); it reads the entry logs and the "
            f"journal and keeps the old index aside.")


def index_dir(ledger_dir: Path) -> Path:
    """Where the index of a bookie whose first ledger dir is `ledger_dir` lives."""
    return Path(ledger_dir) / "index"


def required_size(head: bytes) -> int | None:
    """The bytes LMDB's newest intact meta page says data.mdb holds; None if neither meta page
    is intact (`head` is the file's first two pages, or what there is of them)."""
    def meta(base: int) -> tuple[int, int, int] | None:  # (txn id, last page, page size)
        if len(head) < base + _META_LAST_AT + _META_LAST.size or _META.unpack_from(head, base + 16)[0] != _LMDB_MAGIC:
            return None
        return (*_META_LAST.unpack_from(head, base + _META_LAST_AT)[::-1],
                struct.unpack_from("<I", head, base + _META_PSIZE)[0])

    first = meta(0)
    found = [m for m in (first, meta(first[2] if first else 4096)) if m is not None]
    if not found:
        return None
    _, last, psize = max(found)
    return (last + 1) * psize


def inspect(directory: Path, expect_data: bool) -> None:
    """Raise IndexDamagedError unless the index in `directory` is safe to open: present when the
    bookie holds data, no shorter than its meta pages say, every page readable (walked in a child
    process). An absent index on a fresh bookie is fine (it is created)."""
    path = Path(directory) / DATA_FILE
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        if expect_data:
            raise IndexDamagedError(path, "is missing while the journal mark and entry logs say this bookie "
                                          "holds checkpointed entries") from None
        return
    if size == 0:
        if expect_data:
            raise IndexDamagedError(path, "is empty (0 bytes) while this bookie holds checkpointed entries")
        return
    with open(path, "rb") as f:
        head = f.read(2 * 65536)
    need = required_size(head)
    if need is None:
        raise IndexDamagedError(path, "has no intact LMDB meta page: it was overwritten or is not an index")
    if size < need:
        raise IndexDamagedError(path, f"is {size} bytes but its LMDB meta page says {need}: it was cut")
    res = subprocess.run([sys.executable, "-m", "pybk.bookie.index", str(directory)], capture_output=True,
                         text=True, timeout=3600)
    if res.returncode:
        detail = (res.stderr.strip().splitlines() or [f"exit code {res.returncode}"])[-1]
        raise IndexDamagedError(path, f"is damaged: reading every page failed ({detail})")


def walk(directory: Path) -> int:
    """Read every key and value of every database (run in a child process by inspect); returns
    the number of records. Raises on a damaged page; may crash the process on a bad one."""
    env = lmdb.open(str(directory), readonly=True, lock=False, max_dbs=4, readahead=False)
    n = 0
    try:
        with env.begin() as txn:
            names = [bytes(k) for k in txn.cursor().iternext(values=False)]
        for name in [None, *names]:
            db = env.open_db(name, create=False) if name else None
            with env.begin(db=db) as txn:
                for _ in txn.cursor():  # yields copies of key and value: every page is read
                    n += 1
    finally:
        env.close()
    return n


class Index:
    """LMDB environment with the `locations` and `ledgers` databases."""

    def __init__(self, directory: Path, map_size: int = 64 * 1024 ** 3, sync: bool = True):
        """Open (or create) the index under ledger dir `directory`; call inspect() first."""
        path = index_dir(directory)
        path.mkdir(parents=True, exist_ok=True)
        self.path = path / DATA_FILE
        self.env = lmdb.open(str(path), map_size=map_size, max_dbs=4, sync=sync, metasync=sync,
                             readahead=False, max_readers=256)
        self.locations = self.env.open_db(b"locations")
        self.ledgers = self.env.open_db(b"ledgers")
        self.meta = self.env.open_db(b"meta")

    def bind_journal(self, journal_id: bytes) -> None:
        """Record which journal this index belongs to (once: an index keeps its journal)."""
        with self.env.begin(write=True, db=self.meta) as txn:
            txn.put(_JOURNAL, journal_id, overwrite=False)

    def commit(self, locations: list[tuple[bytes, bytes]], ledgers: Iterable[tuple[int, bytes]],
               checkpoint: tuple[int, int] | None = None) -> None:
        """Record packed (KEY, LOCATION) pairs, ledger states and (for a checkpoint) the journal
        mark it reached, in one transaction."""
        lk = LEDGER_KEY.pack
        with self.env.begin(write=True) as txn:
            cur = txn.cursor(self.locations)
            cur.putmulti(locations)
            for ledger, state in ledgers:
                txn.put(lk(ledger), state, db=self.ledgers)
            if checkpoint is not None:
                txn.put(_CHECKPOINT, CHECKPOINT.pack(*checkpoint), db=self.meta)

    def checkpoint(self) -> tuple[int, int] | None:
        """The journal mark of the last checkpoint recorded here, None if none was."""
        with self.env.begin(db=self.meta) as txn:
            v = txn.get(_CHECKPOINT)
        return CHECKPOINT.unpack(v) if v is not None else None

    def check_current(self, mark: tuple[int, int], expect_data: bool, journal_id: bytes = b"") -> None:
        """IndexDamagedError unless the index belongs to this journal and its checkpoint record is at
        or past the journal mark (past it by one checkpoint when the bookie stopped between index
        commit and mark write)."""
        with self.env.begin(db=self.meta) as txn:
            bound = txn.get(_JOURNAL)
        if bound is not None and journal_id and bytes(bound) != journal_id:
            raise IndexDamagedError(self.path, f"belongs to journal {bytes(bound).hex()}, not to this bookie's "
                                               f"journal {journal_id.hex()}: it was copied from another bookie "
                                               "or kept from an earlier life of this one")
        recorded = self.checkpoint()
        if recorded is None:
            if expect_data:
                raise IndexDamagedError(self.path, "has no checkpoint record while this bookie holds "
                                                   "checkpointed entries: it was replaced by a new, empty one")
        elif tuple(recorded) < tuple(mark):
            raise IndexDamagedError(self.path, f"is stale: its last checkpoint reached journal mark "
                                               f"{tuple(recorded)}, the journal mark is {tuple(mark)}")

    def location(self, ledger: int, entry: int) -> tuple[int, int, int] | None:
        with self.env.begin(db=self.locations) as txn:
            v = txn.get(KEY.pack(ledger, entry))
        return LOCATION.unpack(v) if v is not None else None

    def locations_from(self, ledger: int, first: int, step: int, limit: int) -> np.ndarray:
        """Locations of entries first, first+step, ... (at most `limit`), up to the first one not
        indexed, as a numpy array of LOCATION_DTYPE records (disk, log, offset): one read
        transaction for a whole range read; when step is 1 one cursor walk over the values, whose
        keys are read (and checked all at once) only when the walk passed a gap."""
        with self.env.begin(db=self.locations) as txn:
            if step == 1:
                cur = txn.cursor()
                if not cur.set_key(KEY.pack(ledger, first)):
                    return np.zeros(0, LOCATION_DTYPE)
                values = list(islice(cur.iternext(keys=False), limit))
                # the cursor rests on the last item taken (at the end: nothing, so look at the last
                # key); n sorted distinct keys from (ledger, first) that end at (ledger, first + n - 1)
                # are exactly the entries first..first + n - 1, so their keys need not be read
                end = cur.key() or (cur.last() and cur.key())
                if end == KEY.pack(ledger, first + len(values) - 1):
                    return np.frombuffer(b"".join(values), LOCATION_DTYPE)
                cur.set_key(KEY.pack(ledger, first))
                keys, values = zip(*islice(cur.iternext(), limit))
                ids = np.frombuffer(b"".join(keys), _KEY_DTYPE)
                off = (ids["ledger"] != np.uint64(ledger)) | (ids["entry"] != np.arange(first, first + len(ids),
                                                                                          dtype=np.uint64))
                n = int(np.argmax(off)) if off.any() else len(ids)
                return np.frombuffer(b"".join(values[:n]), LOCATION_DTYPE)
            get = txn.get
            values = []
            for eid in range(first, first + step * limit, step):
                v = get(KEY.pack(ledger, eid))
                if v is None:
                    break
                values.append(v)
            return np.frombuffer(b"".join(values), LOCATION_DTYPE)

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

    def locations_after(self, after: bytes | None, limit: int) -> list[tuple[bytes, bytes]]:
        """Up to `limit` packed (KEY, LOCATION) pairs in key order, from the first key past
        `after` (None: from the start): a scan in bounded steps, one short read transaction each."""
        out: list[tuple[bytes, bytes]] = []
        with self.env.begin(db=self.locations) as txn:
            cur = txn.cursor()
            found = cur.first() if after is None else cur.set_range(after + b"\0")
            while found and len(out) < limit:
                out.append((cur.key(), cur.value()))
                found = cur.next()
        return out

    def delete_locations(self, pairs: Iterable[tuple[bytes, bytes]]) -> list[bytes]:
        """Drop the given packed (KEY, LOCATION) pairs in one transaction, each only if the key
        still points at that location (a checkpoint or compaction that moved it meanwhile wins);
        returns the keys removed."""
        removed: list[bytes] = []
        with self.env.begin(write=True, db=self.locations) as txn:
            for key, location in pairs:
                if txn.get(key) == location and txn.delete(key):
                    removed.append(key)
        return removed

    def close(self) -> None:
        self.env.close()


def main(argv: list[str]) -> int:
    """`python -m pybk.bookie.index DIR`: walk an index (inspect's child process)."""
    try:
        walk(Path(argv[0]))
    except lmdb.Error as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
