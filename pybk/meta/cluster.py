"""The cluster record `/<prefix>/cluster`: instance id and layout version, created exactly once.

The first bookie to start creates it under a create-if-absent transaction, so two bookies
starting together agree on one instance id; cookies carry it, so a bookie pointed at another
cluster's etcd refuses to start.

The record also holds the cluster's `ledger_defaults` (E/Qw/Qa clients use unless they ask
otherwise), written by whoever reconciles the cluster (the operator, `pybk local`) from the
BookieCluster's `spec.ledgerDefaults`, by CAS so the instance id is never lost.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from .errors import BadMetadataError, NoClusterError
from .etcd import Etcd, cmp_create, cmp_mod, op_get, op_put

LAYOUT_VERSION = 1


@dataclass(frozen=True)
class LedgerDefaults:
    """E / Qw / Qa that clients of a cluster use unless they ask otherwise."""
    ensemble: int = 3
    write_quorum: int = 3
    ack_quorum: int = 2

    def to_json(self) -> dict:
        return {"ensemble": self.ensemble, "write_quorum": self.write_quorum, "ack_quorum": self.ack_quorum}

    @classmethod
    def from_json(cls, d: object) -> "LedgerDefaults | None":
        """The defaults stored in a cluster record, or None when absent or malformed (then
        clients keep their own defaults)."""
        try:
            ld = cls(int(d["ensemble"]), int(d["write_quorum"]), int(d["ack_quorum"]))  # type: ignore[index]
        except (TypeError, KeyError, ValueError):
            return None
        return ld if ld.ensemble >= ld.write_quorum >= ld.ack_quorum >= 1 else None

    def geometry(self) -> tuple[int, int, int]:
        return self.ensemble, self.write_quorum, self.ack_quorum


class Cluster:
    """`store.cluster`: the instance id of this cluster."""

    def __init__(self, etcd: Etcd, prefix: bytes):
        self.etcd = etcd
        self.key = prefix + b"cluster"
        self.where = f"etcd://{etcd.uri.endpoint_text}/{etcd.uri.prefix}"

    @staticmethod
    def _decode(data: bytes) -> dict:
        try:
            d = json.loads(data)
            if not isinstance(d.get("instance_id"), str):
                raise ValueError("no instance_id")
            return d
        except (ValueError, AttributeError) as exc:
            raise BadMetadataError(f"undecodable cluster record {data[:80]!r}: {exc}") from None

    async def get(self) -> dict | None:
        """The cluster record ({instance_id, layout_version}) or None before the first bookie."""
        kv = await self.etcd.get(self.key)
        return self._decode(kv.value) if kv else None

    async def require(self) -> dict:
        """The cluster record, or NoClusterError naming where it was looked for: what clients that
        only read (the Spark source, `pybk shell listledgers`) check first, so that a wrong prefix
        is an error instead of an empty cluster."""
        record = await self.get()
        if record is None:
            raise NoClusterError(f"no pybk cluster at {self.where} (no cluster record under that prefix: "
                                 "is the prefix right, and has a bookie of this cluster ever started?)")
        return record

    async def instance_id(self, create: bool = True) -> str | None:
        """The cluster's instance id, creating it (once, agreed by CAS) unless create is False."""
        record = await self.get()
        if record is not None or not create:
            return record["instance_id"] if record else None
        value = json.dumps({"instance_id": str(uuid.uuid4()), "layout_version": LAYOUT_VERSION}).encode()
        resp = await self.etcd.txn([cmp_create(self.key, 0)], [op_put(self.key, value)], [op_get(self.key)],
                                   what="create cluster instance id")
        if resp.succeeded:
            return json.loads(value)["instance_id"]
        return self._decode(resp.responses[0].response_range.kvs[0].value)["instance_id"]

    async def ledger_defaults(self) -> LedgerDefaults | None:
        """The cluster's stored ledger defaults (None: none stored, clients use their own)."""
        record = await self.get()
        return LedgerDefaults.from_json(record.get("ledger_defaults")) if record else None

    async def set_ledger_defaults(self, defaults: LedgerDefaults) -> None:
        """Store the ledger defaults in the cluster record (creating the record, with a new
        instance id, if no bookie has yet), by CAS: the instance id and other fields are kept."""
        while True:
            kv = await self.etcd.get(self.key)
            record = self._decode(kv.value) if kv else {"instance_id": str(uuid.uuid4()),
                                                         "layout_version": LAYOUT_VERSION}
            if LedgerDefaults.from_json(record.get("ledger_defaults")) == defaults:
                return
            value = json.dumps({**record, "ledger_defaults": defaults.to_json()}).encode()
            guard = cmp_mod(self.key, kv.mod_revision) if kv else cmp_create(self.key, 0)
            resp = await self.etcd.txn([guard], [op_put(self.key, value)], what="store ledger defaults")
            if resp.succeeded:
                return
