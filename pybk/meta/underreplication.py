"""Under-replication markers `/<prefix>/underreplicated/<20-digit ledger id>`: which bookies'
replicas of the ledger are missing and since when. The auditor marks, replication workers
(holding the ledger's lock) repair and unmark; every change is CAS."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import AsyncIterator, Iterable

from .errors import BadMetadataError, VersionConflictError
from .etcd import Etcd, cmp_create, cmp_mod, op_delete, op_get, op_put
from .ledgers import ledger_key_suffix
from .watch import DELETE, watch_range


@dataclass
class Marker:
    """Ledger ledger_id lacks replicas on `missing` bookies since since_ms (epoch ms)."""

    ledger_id: int
    missing: list[str]
    since_ms: int
    version: int = field(default=0, compare=False)

    def to_bytes(self) -> bytes:
        return json.dumps({"missing": sorted(self.missing), "since_ms": self.since_ms}).encode()

    @classmethod
    def from_bytes(cls, ledger_id: int, data: bytes, version: int = 0) -> "Marker":
        try:
            d = json.loads(data)
            return cls(ledger_id, list(d["missing"]), int(d["since_ms"]), version)
        except (ValueError, KeyError, TypeError) as exc:
            raise BadMetadataError(f"undecodable under-replication marker of ledger {ledger_id}: {exc!r}") from None


class UnderReplication:
    """`store.underreplication`: mark, get, list, unmark, watch."""

    def __init__(self, etcd: Etcd, prefix: bytes):
        self.etcd = etcd
        self.dir = prefix + b"underreplicated/"

    def key(self, ledger_id: int) -> bytes:
        return self.dir + ledger_key_suffix(ledger_id)

    def _id(self, key: bytes) -> int | None:
        suffix = key[len(self.dir):]
        return int(suffix) if len(suffix) == 20 and suffix.isdigit() else None

    async def mark(self, ledger_id: int, missing: Iterable[str]) -> Marker:
        """Add bookies to the ledger's marker (creating it with since = now); returns the marker."""
        key = self.key(ledger_id)
        missing = set(missing)
        kv = await self.etcd.get(key)
        while True:
            if kv is None:
                marker = Marker(ledger_id, sorted(missing), int(time.time() * 1000))
                guard = cmp_create(key, 0)
            else:
                old = Marker.from_bytes(ledger_id, kv.value, kv.mod_revision)
                if missing <= set(old.missing):
                    return old
                marker = Marker(ledger_id, sorted(missing | set(old.missing)), old.since_ms)
                guard = cmp_mod(key, kv.mod_revision)
            resp = await self.etcd.txn([guard], [op_put(key, marker.to_bytes())], [op_get(key)],
                                       what=f"mark ledger {ledger_id} under-replicated")
            if resp.succeeded:
                marker.version = resp.header.revision
                return marker
            kvs = resp.responses[0].response_range.kvs
            kv = kvs[0] if kvs else None

    async def get(self, ledger_id: int) -> Marker | None:
        kv = await self.etcd.get(self.key(ledger_id))
        return Marker.from_bytes(ledger_id, kv.value, kv.mod_revision) if kv else None

    async def unmark(self, ledger_id: int, version: int | None = None) -> bool:
        """Remove the marker (only if unchanged since `version`, when given: a bookie marked
        meanwhile must not be forgotten). False if there was none."""
        key = self.key(ledger_id)
        if version is None:
            return (await self.etcd.delete(key)).deleted > 0
        resp = await self.etcd.txn([cmp_mod(key, version)], [op_delete(key)], [op_get(key)],
                                   what=f"unmark ledger {ledger_id}")
        if resp.succeeded:
            return True
        kvs = resp.responses[0].response_range.kvs
        if not kvs:
            return False
        raise VersionConflictError(f"under-replication marker of ledger {ledger_id}", version,
                                   Marker.from_bytes(ledger_id, kvs[0].value, kvs[0].mod_revision),
                                   kvs[0].mod_revision)

    async def list(self, page_size: int = 1000) -> AsyncIterator[Marker]:
        """Every marker in ledger id order, paged."""
        key, stop = self.dir + b"0", self.dir + b":"
        while True:
            resp = await self.etcd.range(key, stop, limit=page_size)
            for kv in resp.kvs:
                ledger_id = self._id(kv.key)
                if ledger_id is not None:
                    yield Marker.from_bytes(ledger_id, kv.value, kv.mod_revision)
            if not resp.more or not resp.kvs:
                return
            key = resp.kvs[-1].key + b"\0"

    async def count(self) -> int:
        return (await self.etcd.range(self.dir + b"0", self.dir + b":", count_only=True)).count

    async def watch(self, initial: bool = True) -> AsyncIterator[tuple[int, Marker | None]]:
        """(ledger id, marker) on every change, marker None when unmarked; with initial, the
        existing markers first (read at one revision, then changes after it)."""
        async for ev in watch_range(self.etcd, self.dir + b"0", self.dir + b":", initial):
            ledger_id = self._id(ev.key)
            if ledger_id is None:
                continue
            yield ledger_id, (None if ev.type == DELETE else Marker.from_bytes(ledger_id, ev.value, ev.revision))
