"""The cluster record `/<prefix>/cluster`: instance id and layout version, created exactly once.

The first bookie to start creates it under a create-if-absent transaction, so two bookies
starting together agree on one instance id; cookies carry it, so a bookie pointed at another
cluster's etcd refuses to start.
"""
from __future__ import annotations

import json
import uuid

from .errors import BadMetadataError, NoClusterError
from .etcd import Etcd, cmp_create, op_get, op_put

LAYOUT_VERSION = 1


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
