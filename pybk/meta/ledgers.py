"""Ledger metadata: the model (every field in docs/protocol.md), its compact protobuf encoding and JSON
view, and the etcd operations on it (create with block id allocation, get, CAS, the one
read-change-CAS loop every updater uses, delete, list, watch).

Keys: `/<prefix>/ledgers/<20-digit id>` (so key order is id order) and `/<prefix>/ledgers/idgen`
(the next unallocated id). The metadata version is the key's etcd mod_revision; every change is
a compare-and-swap on it.
"""
from __future__ import annotations

import asyncio
import base64
import bisect
import dataclasses
import enum
import logging
import time
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable, Generic, TypeVar

from google.protobuf.message import DecodeError

from pybk.entry import DigestType
from pybk.ledger import write_set_bookies

from . import metadata_pb2
from .errors import (BadMetadataError, LedgerExistsError, MetadataError, NoSuchLedgerError,
                     VersionConflictError, WatchCompactedError)
from .etcd import Etcd, cmp_create, cmp_mod, op_delete, op_get, op_put
from .watch import DELETE, Watch

log = logging.getLogger(__name__)

MAX_LEDGER_ID = (1 << 63) - 1
FORMAT_VERSION = 1
_PB = metadata_pb2.LedgerMetadataFormat


class LedgerState(enum.Enum):
    """OPEN while a writer may add; IN_RECOVERY while being fenced and recovered; CLOSED for good."""

    OPEN = "OPEN"
    IN_RECOVERY = "IN_RECOVERY"
    CLOSED = "CLOSED"


_STATE_TO_PB = {LedgerState.OPEN: _PB.OPEN, LedgerState.IN_RECOVERY: _PB.IN_RECOVERY,
                LedgerState.CLOSED: _PB.CLOSED}
_STATE_FROM_PB = {v: k for k, v in _STATE_TO_PB.items()}
_DIGEST_TO_PB = {DigestType.CRC32C: _PB.CRC32C, DigestType.MAC: _PB.MAC}
_DIGEST_FROM_PB = {v: k for k, v in _DIGEST_TO_PB.items()}


@dataclass
class Fragment:
    """Entries from first_entry_id on (up to the next fragment) are stored on these E bookies."""

    first_entry_id: int
    bookies: list[str]


@dataclass
class LedgerMetadata:
    """One ledger's metadata; `version` is the etcd mod_revision it was read at (0: never stored)."""

    ledger_id: int
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    state: LedgerState = LedgerState.OPEN
    last_entry_id: int = -1
    length: int = 0
    digest_type: DigestType = DigestType.CRC32C
    password_hash: bytes = b""
    ctime_ms: int = 0
    custom: dict[str, bytes] = field(default_factory=dict)
    fragments: list[Fragment] = field(default_factory=list)
    version: int = 0
    # pybk.entry.key_check of the master key: bookies verify a ledger's first key against it
    key_check: bytes = field(default=b"", repr=False)
    # legacy: the master key itself, stored by earlier releases (read, never written any more);
    # b"" for every ledger created now (docs/security.md: why the key is not in the metadata)
    master_key: bytes = field(default=b"", repr=False)

    @property
    def is_closed(self) -> bool:
        return self.state is LedgerState.CLOSED

    def ensemble_for(self, entry_id: int) -> list[str]:
        """The ensemble of the fragment holding entry_id (the last fragment starting at or before it)."""
        if not self.fragments:
            raise BadMetadataError(f"ledger {self.ledger_id} has no fragments")
        starts = [f.first_entry_id for f in self.fragments]
        i = bisect.bisect_right(starts, max(entry_id, starts[0])) - 1
        return self.fragments[i].bookies

    def write_set(self, entry_id: int) -> list[str]:
        """The Qw bookies entry_id is written to, by the striping of `pybk.ledger.write_set`."""
        return write_set_bookies(entry_id, self.ensemble_for(entry_id), self.write_quorum)

    @property
    def current_ensemble(self) -> list[str]:
        """The ensemble of the last fragment (where new entries go)."""
        return self.fragments[-1].bookies if self.fragments else []

    def bookies(self) -> set[str]:
        """Every bookie any fragment references."""
        return {b for f in self.fragments for b in f.bookies}

    def replace(self, **changes) -> "LedgerMetadata":
        """A copy with fields changed (the version is kept, so a CAS of it checks the original)."""
        copy = dataclasses.replace(self, **changes)
        if "fragments" not in changes:
            copy.fragments = [Fragment(f.first_entry_id, list(f.bookies)) for f in self.fragments]
        if "custom" not in changes:
            copy.custom = dict(self.custom)
        return copy

    def validate(self) -> None:
        """Raise BadMetadataError if the fields break the ledger invariants."""
        def bad(msg: str):
            raise BadMetadataError(f"ledger {self.ledger_id}: {msg}")
        if not 0 < self.ledger_id <= MAX_LEDGER_ID:
            bad("id must be a positive 63-bit integer")
        if not self.ensemble_size >= self.write_quorum >= self.ack_quorum >= 1:
            bad(f"need ensemble size >= write quorum >= ack quorum >= 1, got E={self.ensemble_size} "
                f"Qw={self.write_quorum} Qa={self.ack_quorum}")
        if not isinstance(self.state, LedgerState):
            bad(f"state must be a LedgerState, got {self.state!r}")
        if not isinstance(self.digest_type, DigestType):
            bad(f"digest type must be a DigestType, got {self.digest_type!r}")
        if not self.fragments:
            bad("needs at least one fragment")
        previous = -1
        for frag in self.fragments:
            if len(frag.bookies) != self.ensemble_size:
                bad(f"fragment at entry {frag.first_entry_id} has {len(frag.bookies)} bookies, "
                    f"ensemble size is {self.ensemble_size}")
            if len(set(frag.bookies)) != len(frag.bookies):
                bad(f"fragment at entry {frag.first_entry_id} lists a bookie twice: {frag.bookies}")
            if frag.first_entry_id < 0 or (previous >= 0 and frag.first_entry_id < previous):
                bad("fragments must start at entry ids >= 0 in non-decreasing order")
            previous = frag.first_entry_id
        if self.fragments[0].first_entry_id != 0:
            bad("the first fragment must start at entry 0")
        if self.last_entry_id < -1 or self.length < 0:
            bad("last entry id must be >= -1 and length >= 0")
        for k, v in self.custom.items():
            if not isinstance(k, str) or not isinstance(v, (bytes, bytearray)):
                bad(f"custom metadata must map str to bytes, got {k!r}: {type(v).__name__}")

    def to_bytes(self) -> bytes:
        """The compact protobuf encoding stored in etcd."""
        msg = _PB(format_version=FORMAT_VERSION, ledger_id=self.ledger_id, ensemble_size=self.ensemble_size,
                  write_quorum=self.write_quorum, ack_quorum=self.ack_quorum, state=_STATE_TO_PB[self.state],
                  last_entry_id=self.last_entry_id, length=self.length,
                  digest_type=_DIGEST_TO_PB[self.digest_type], password_hash=self.password_hash,
                  ctime_ms=self.ctime_ms, custom={k: bytes(v) for k, v in self.custom.items()},
                  master_key=self.master_key, key_check=self.key_check)
        for frag in self.fragments:
            msg.fragments.add(first_entry_id=frag.first_entry_id, bookies=frag.bookies)
        return msg.SerializeToString(deterministic=True)

    @classmethod
    def from_bytes(cls, data: bytes, version: int = 0, ledger_id: int | None = None) -> "LedgerMetadata":
        """Decode what to_bytes stored; raise BadMetadataError if it is not ledger metadata."""
        msg = _PB()
        try:
            msg.ParseFromString(data)
        except DecodeError as exc:
            raise BadMetadataError(f"ledger {ledger_id}: undecodable metadata ({exc})") from None
        if msg.format_version != FORMAT_VERSION:
            raise BadMetadataError(f"ledger {ledger_id}: unknown metadata format version {msg.format_version}")
        if ledger_id is not None and msg.ledger_id != ledger_id:
            raise BadMetadataError(f"metadata stored for ledger {ledger_id} names ledger {msg.ledger_id}")
        return cls(ledger_id=msg.ledger_id, ensemble_size=msg.ensemble_size, write_quorum=msg.write_quorum,
                   ack_quorum=msg.ack_quorum, state=_STATE_FROM_PB[msg.state],
                   last_entry_id=msg.last_entry_id, length=msg.length,
                   digest_type=_DIGEST_FROM_PB[msg.digest_type], password_hash=msg.password_hash,
                   ctime_ms=msg.ctime_ms, custom=dict(msg.custom),
                   fragments=[Fragment(f.first_entry_id, list(f.bookies)) for f in msg.fragments],
                   version=version, master_key=msg.master_key, key_check=msg.key_check)

    def to_json(self) -> dict:
        """A view for humans and `-o json`: bytes as base64, the password hash as hex. Neither the
        key check nor a legacy master key is shown (the view is for reading, not for writing)."""
        out = {"ledger_id": self.ledger_id, "ensemble_size": self.ensemble_size,
               "write_quorum": self.write_quorum, "ack_quorum": self.ack_quorum, "state": self.state.value,
               "last_entry_id": self.last_entry_id, "length": self.length,
               "digest_type": self.digest_type.value, "password_hash": self.password_hash.hex(),
               "ctime_ms": self.ctime_ms,
               "custom": {k: base64.b64encode(v).decode() for k, v in self.custom.items()},
               "fragments": [{"first_entry_id": f.first_entry_id, "bookies": list(f.bookies)}
                             for f in self.fragments],
               "version": self.version}
        return out

    @classmethod
    def from_json(cls, d: dict) -> "LedgerMetadata":
        """Inverse of to_json, except for the key check and a legacy master key, which to_json does
        not show: the result has none (b""), so it cannot stand in for the stored metadata."""
        try:
            return cls(ledger_id=int(d["ledger_id"]), ensemble_size=int(d["ensemble_size"]),
                       write_quorum=int(d["write_quorum"]), ack_quorum=int(d["ack_quorum"]),
                       state=LedgerState(d.get("state", "OPEN")), last_entry_id=int(d.get("last_entry_id", -1)),
                       length=int(d.get("length", 0)), digest_type=DigestType(d.get("digest_type", "CRC32C")),
                       password_hash=bytes.fromhex(d.get("password_hash", "")),
                       ctime_ms=int(d.get("ctime_ms", 0)),
                       custom={k: base64.b64decode(v) for k, v in d.get("custom", {}).items()},
                       fragments=[Fragment(int(f["first_entry_id"]), list(f["bookies"]))
                                  for f in d.get("fragments", [])],
                       version=int(d.get("version", 0)))
        except (KeyError, ValueError, TypeError) as exc:
            raise BadMetadataError(f"bad ledger metadata JSON: {exc!r}") from None


R = TypeVar("R")


@dataclass(frozen=True)
class Unchanged(Generic[R]):
    """What an update's `change` returns to leave the stored metadata as it is; `reason` (of the
    caller's own type) says why, e.g. the ledger is no longer in the state the change needs."""

    reason: R | None = None


@dataclass(frozen=True)
class UpdateResult(Generic[R]):
    """How `Ledgers.update` ended: `metadata` as stored now (the version written, or the one
    `change` declined to change) and `unchanged`, `change`'s answer when it wrote nothing."""

    metadata: LedgerMetadata
    unchanged: Unchanged[R] | None = None

    @property
    def written(self) -> bool:
        return self.unchanged is None

    @property
    def reason(self) -> R | None:
        """Why nothing was written (None when something was)."""
        return self.unchanged.reason if self.unchanged is not None else None


Change = Callable[[LedgerMetadata], LedgerMetadata | Unchanged[R]]


def ledger_key_suffix(ledger_id: int) -> bytes:
    return b"%020d" % ledger_id


class Ledgers:
    """Ledger metadata operations on etcd (`store.ledgers`)."""

    def __init__(self, etcd: Etcd, prefix: bytes, id_block: int = 1000):
        self.etcd = etcd
        self.dir = prefix + b"ledgers/"
        self.idgen_key = self.dir + b"idgen"
        self.id_block = id_block
        self._ids = range(0)
        self._ids_pos = 0
        self._id_lock = asyncio.Lock()

    def key(self, ledger_id: int) -> bytes:
        if not isinstance(ledger_id, int) or not 0 < ledger_id <= MAX_LEDGER_ID:
            raise BadMetadataError(f"ledger id must be a positive 63-bit integer, got {ledger_id!r}")
        return self.dir + ledger_key_suffix(ledger_id)

    def _id_of(self, key: bytes) -> int | None:
        suffix = key[len(self.dir):]
        return int(suffix) if len(suffix) == 20 and suffix.isdigit() else None

    async def allocate_id(self) -> int:
        """A ledger id no other allocator (in any process) ever gets: taken from a block of
        `id_block` ids reserved by CAS on ledgers/idgen."""
        async with self._id_lock:
            if self._ids_pos >= len(self._ids):
                self._ids = await self._reserve_block()
                self._ids_pos = 0
            self._ids_pos += 1
            return self._ids[self._ids_pos - 1]

    async def _reserve_block(self) -> range:
        kv = await self.etcd.get(self.idgen_key)
        while True:
            start = int(kv.value) if kv is not None else 1
            end = min(start + self.id_block, MAX_LEDGER_ID + 1)
            if start > MAX_LEDGER_ID:
                raise MetadataError("ledger ids exhausted")
            guard = cmp_mod(self.idgen_key, kv.mod_revision) if kv else cmp_create(self.idgen_key, 0)
            resp = await self.etcd.txn([guard], [op_put(self.idgen_key, b"%d" % end)],
                                       [op_get(self.idgen_key)], what="ledger id allocation")
            if resp.succeeded:
                return range(start, end)
            kvs = resp.responses[0].response_range.kvs
            kv = kvs[0] if kvs else None

    async def create(self, ensemble: list[str], write_quorum: int, ack_quorum: int, *,
                     digest_type: DigestType = DigestType.CRC32C, password_hash: bytes = b"",
                     custom: dict[str, bytes] | None = None, ensemble_size: int | None = None,
                     ledger_id: int | None = None, key_check: bytes = b"") -> LedgerMetadata:
        """Store metadata of a new OPEN ledger with one fragment on `ensemble`; allocates the id
        unless ledger_id is given (then LedgerExistsError if it is taken). `key_check` lets bookies
        verify the ledger's master key (pybk.entry.key_check); the key itself is not stored."""
        md = LedgerMetadata(ledger_id=ledger_id or 1, ensemble_size=ensemble_size or len(ensemble),
                            write_quorum=write_quorum, ack_quorum=ack_quorum, digest_type=digest_type,
                            password_hash=bytes(password_hash), ctime_ms=int(time.time() * 1000),
                            custom=dict(custom or {}), fragments=[Fragment(0, list(ensemble))],
                            key_check=bytes(key_check))
        md.validate()
        while True:
            md.ledger_id = ledger_id if ledger_id is not None else await self.allocate_id()
            key = self.key(md.ledger_id)
            resp = await self.etcd.txn([cmp_create(key, 0)], [op_put(key, md.to_bytes())],
                                       what=f"create ledger {md.ledger_id}")
            if resp.succeeded:
                md.version = resp.header.revision
                return md
            if ledger_id is not None:
                raise LedgerExistsError(ledger_id)

    async def get(self, ledger_id: int) -> LedgerMetadata:
        """The ledger's metadata with its version; NoSuchLedgerError if absent."""
        kv = await self.etcd.get(self.key(ledger_id))
        if kv is None:
            raise NoSuchLedgerError(ledger_id)
        return LedgerMetadata.from_bytes(kv.value, kv.mod_revision, ledger_id)

    async def exists(self, ledger_id: int) -> bool:
        resp = await self.etcd.range(self.key(ledger_id), b"", count_only=True)
        return resp.count > 0

    async def cas(self, md: LedgerMetadata) -> LedgerMetadata:
        """Store md if the stored version is still md.version; returns md with its new version.

        Raises VersionConflictError (with `.current`, the stored metadata re-read in the same
        transaction) if someone changed it first, NoSuchLedgerError if it was deleted."""
        md.validate()
        key = self.key(md.ledger_id)
        resp = await self.etcd.txn([cmp_mod(key, md.version)], [op_put(key, md.to_bytes())], [op_get(key)],
                                   what=f"update ledger {md.ledger_id}")
        if resp.succeeded:
            return md.replace(version=resp.header.revision)
        kvs = resp.responses[0].response_range.kvs
        if not kvs:
            raise NoSuchLedgerError(md.ledger_id)
        current = LedgerMetadata.from_bytes(kvs[0].value, kvs[0].mod_revision, md.ledger_id)
        raise VersionConflictError(f"ledger {md.ledger_id}", md.version, current, current.version)

    async def update(self, ledger_id: int, change: Change[R],
                     current: LedgerMetadata | None = None) -> UpdateResult[R]:
        """The one metadata update loop: read the ledger (or start from `current`, the metadata the
        caller holds, saving a read: a stale copy only costs a conflict), ask `change` what it
        should become, CAS that; on a version conflict ask `change` again about the metadata that
        won, until a CAS sticks or `change` returns Unchanged. `change` must be pure: it may run
        many times. Its exceptions propagate, as does NoSuchLedgerError if the ledger is deleted."""
        md = current if current is not None else await self.get(ledger_id)
        while True:
            new = change(md)
            if isinstance(new, Unchanged):
                return UpdateResult(md, new)
            try:
                return UpdateResult(await self.cas(new))
            except VersionConflictError as e:
                md = e.current if e.current is not None else await self.get(ledger_id)

    async def delete(self, ledger_id: int, version: int | None = None) -> None:
        """Delete the ledger's metadata (only if still at `version`, when given)."""
        key = self.key(ledger_id)
        if version is None:
            resp = await self.etcd.delete(key)
            if resp.deleted == 0:
                raise NoSuchLedgerError(ledger_id)
            return
        resp = await self.etcd.txn([cmp_mod(key, version)], [op_delete(key)], [op_get(key)],
                                   what=f"delete ledger {ledger_id}")
        if not resp.succeeded:
            kvs = resp.responses[0].response_range.kvs
            if not kvs:
                raise NoSuchLedgerError(ledger_id)
            current = LedgerMetadata.from_bytes(kvs[0].value, kvs[0].mod_revision, ledger_id)
            raise VersionConflictError(f"ledger {ledger_id}", version, current, current.version)

    async def _pages(self, start: int, end: int | None, page_size: int, keys_only: bool):
        """Range reads of at most page_size keys each, in key (= id) order.

        etcd 3.5 counts every key of a request's [key, range_end) even with a limit, so paging
        with an open range end costs O(remaining keys) per page (quadratic overall). Each
        request therefore covers an id window that adapts to the key density: it grows while
        windows come back sparse and shrinks when one holds more than a page.
        """
        lo, stop = max(start, 0), min(end if end is not None else MAX_LEDGER_ID + 1, MAX_LEDGER_ID + 1)
        window = page_size
        while lo < stop:
            hi = min(lo + window, stop)
            resp = await self.etcd.range(self.dir + ledger_key_suffix(lo), self.dir + ledger_key_suffix(hi),
                                         limit=page_size, keys_only=keys_only)
            if resp.kvs:
                yield resp.kvs
            if resp.more:
                lo = int(resp.kvs[-1].key[len(self.dir):]) + 1
                window = max(page_size, window // 2)
            else:
                lo = hi
                if len(resp.kvs) < page_size // 2:
                    window *= 2

    async def pages(self, start: int = 0, end: int | None = None, page_size: int = 1000) -> AsyncIterator[list[int]]:
        """Ledger ids in [start, end) in increasing order, one list per etcd range request of at
        most page_size keys (only one page is in memory at a time)."""
        if page_size <= 0:
            raise BadMetadataError(f"page size must be positive, got {page_size}")
        async for kvs in self._pages(start, end, page_size, True):
            page = [i for i in map(self._id_of, (kv.key for kv in kvs)) if i is not None]
            if page:
                yield page

    async def list(self, start: int = 0, end: int | None = None, page_size: int = 1000) -> AsyncIterator[int]:
        """Ledger ids in [start, end) in increasing order, fetched page_size keys at a time."""
        async for page in self.pages(start, end, page_size):
            for ledger_id in page:
                yield ledger_id

    async def list_metadata(self, start: int = 0, end: int | None = None,
                            page_size: int = 500) -> AsyncIterator[LedgerMetadata]:
        """Like list, with each ledger's metadata."""
        async for kvs in self._pages(start, end, page_size, False):
            for kv in kvs:
                ledger_id = self._id_of(kv.key)
                if ledger_id is not None:
                    yield LedgerMetadata.from_bytes(kv.value, kv.mod_revision, ledger_id)

    async def count(self) -> int:
        """How many ledgers exist (one etcd count query)."""
        resp = await self.etcd.range(self.dir + b"0", self.dir + b":", count_only=True)
        return resp.count

    def watch(self, ledger_id: int, start_revision: int = 0) -> "LedgerWatch":
        """Changes of one ledger: yields LedgerMetadata after each change, None once deleted."""
        return LedgerWatch(Watch(self.etcd, self.key(ledger_id), start_revision=start_revision), ledger_id)


class LedgerWatch:
    """`async for md in store.ledgers.watch(id)`: the ledger's metadata after each change (None: deleted)."""

    def __init__(self, watch: Watch, ledger_id: int):
        self._watch = watch
        self.ledger_id = ledger_id

    def __aiter__(self) -> "LedgerWatch":
        return self

    async def __anext__(self) -> LedgerMetadata | None:
        try:
            ev = await self._watch.__anext__()
        except WatchCompactedError:
            return await self._reread()
        if ev.type == DELETE:
            return None
        return LedgerMetadata.from_bytes(ev.value, ev.revision, self.ledger_id)

    async def _reread(self) -> LedgerMetadata | None:
        """The watch lost its history to compaction: the metadata as it is now, then watch on."""
        old = self._watch
        await old.close()
        resp = await old.etcd.range(old.key, b"")
        log.info("watch on ledger %d lost its history to compaction; re-read at revision %d",
                 self.ledger_id, resp.header.revision)
        self._watch = Watch(old.etcd, old.key, start_revision=resp.header.revision + 1)
        if not resp.kvs:
            return None
        return LedgerMetadata.from_bytes(resp.kvs[0].value, resp.kvs[0].mod_revision, self.ledger_id)

    async def __aenter__(self) -> "LedgerWatch":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        await self._watch.close()
