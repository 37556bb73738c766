"""Decommission requests and their progress, `/<prefix>/decommission/<bookie id>` (JSON, CAS).

The operator or `pybk shell decommission` requests; the recovery side drains the bookie and
records progress here, so the CLI, the admin API and the operator all show the same state.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, replace
from typing import AsyncIterator

from .errors import BadMetadataError, VersionConflictError
from .etcd import Etcd, cmp_create, cmp_mod, op_get, op_put, prefix_end
from .registry import check_bookie_id
from .watch import DELETE, watch_range

REQUESTED = "requested"
DRAINING = "draining"
DONE = "done"
FAILED = "failed"
STATES = (REQUESTED, DRAINING, DONE, FAILED)


@dataclass
class Decommission:
    """A drain request for one bookie and how far it got."""

    bookie_id: str
    state: str = REQUESTED
    requested_ms: int = 0
    updated_ms: int = 0
    ledgers_total: int = -1
    ledgers_remaining: int = -1
    message: str = ""
    version: int = field(default=0, compare=False)

    def to_bytes(self) -> bytes:
        d = asdict(self)
        d.pop("version")
        return json.dumps(d, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes, version: int = 0) -> "Decommission":
        try:
            d = json.loads(data)
            d["version"] = version
            out = cls(**d)
        except (ValueError, TypeError) as exc:
            raise BadMetadataError(f"undecodable decommission record {data[:80]!r}: {exc}") from None
        if out.state not in STATES:
            raise BadMetadataError(f"decommission of {out.bookie_id}: unknown state {out.state!r}")
        return out

    def to_json(self) -> dict:
        return asdict(self)


class Decommissions:
    """`store.decommission`: request, get, update progress (CAS), remove, list, watch."""

    def __init__(self, etcd: Etcd, prefix: bytes):
        self.etcd = etcd
        self.dir = prefix + b"decommission/"

    def key(self, bookie_id: str) -> bytes:
        return self.dir + check_bookie_id(bookie_id).encode()

    async def request(self, bookie_id: str, message: str = "") -> Decommission:
        """Ask for the bookie to be drained; returns the existing request if there is one."""
        key = self.key(bookie_id)
        now = int(time.time() * 1000)
        rec = Decommission(bookie_id, REQUESTED, now, now, message=message)
        resp = await self.etcd.txn([cmp_create(key, 0)], [op_put(key, rec.to_bytes())], [op_get(key)],
                                   what=f"request decommission of {bookie_id}")
        if resp.succeeded:
            rec.version = resp.header.revision
            return rec
        kv = resp.responses[0].response_range.kvs[0]
        return Decommission.from_bytes(kv.value, kv.mod_revision)

    async def get(self, bookie_id: str) -> Decommission | None:
        kv = await self.etcd.get(self.key(bookie_id))
        return Decommission.from_bytes(kv.value, kv.mod_revision) if kv else None

    async def update(self, rec: Decommission, **changes) -> Decommission:
        """CAS the record (with changes applied) against rec.version; VersionConflictError if moved on."""
        if "state" in changes and changes["state"] not in STATES:
            raise BadMetadataError(f"unknown decommission state {changes['state']!r}")
        new = replace(rec, updated_ms=int(time.time() * 1000), **changes)
        key = self.key(rec.bookie_id)
        resp = await self.etcd.txn([cmp_mod(key, rec.version)], [op_put(key, new.to_bytes())], [op_get(key)],
                                   what=f"update decommission of {rec.bookie_id}")
        if not resp.succeeded:
            kvs = resp.responses[0].response_range.kvs
            current = Decommission.from_bytes(kvs[0].value, kvs[0].mod_revision) if kvs else None
            raise VersionConflictError(f"decommission of {rec.bookie_id}", rec.version, current,
                                       current.version if current else None)
        new.version = resp.header.revision
        return new

    async def remove(self, bookie_id: str) -> bool:
        """Drop the record (cancel, or clean up after done)."""
        return (await self.etcd.delete(self.key(bookie_id))).deleted > 0

    async def list(self) -> dict[str, Decommission]:
        resp = await self.etcd.range(self.dir, prefix_end(self.dir))
        return {kv.key[len(self.dir):].decode(): Decommission.from_bytes(kv.value, kv.mod_revision)
                for kv in resp.kvs}

    async def watch(self) -> AsyncIterator[tuple[str, Decommission | None]]:
        """(bookie id, record) on each change from now on; None when removed."""
        async for ev in watch_range(self.etcd, self.dir, prefix_end(self.dir), initial=False):
            bid = ev.key[len(self.dir):].decode()
            yield bid, (None if ev.type == DELETE else Decommission.from_bytes(ev.value, ev.revision))
