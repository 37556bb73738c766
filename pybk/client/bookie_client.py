"""A low-level async client for one bookie, used by the ledger client, autorecovery and tests.

Adds are batched adaptively over one long-lived Add stream: when nothing is in flight an add is
sent at once (with whatever else was added in the same event loop turn); otherwise adds coalesce
until the previous batch returns or the pending batch reaches the size cap.
"""
from __future__ import annotations

import asyncio
import enum
import ssl
from contextlib import aclosing
from typing import AsyncIterator, Callable, Iterator, Sequence

import grpc
import numpy as np
from google.protobuf.message import DecodeError

from pybk.entry import HEADER_SIZE
from pybk.proto import pb, rpc, wire
from pybk.proto.wire import ADD_RUNS_HEADER, DEFAULT_MAX_MESSAGE_BYTES, MESSAGE_HEADROOM
from pybk.security.settings import ClientSecurity
from pybk.transport.ngh2_client import CLOSED_AT_ONCE, CallError, ClientStream, ServerStream

_ENTRY_OVERHEAD = 64  # bytes an AddEntry adds to its body on the wire (ids, key, flags), rounded up
ADD_METHOD = "/pybk.Bookie/Add"
READ_METHOD = "/pybk.Bookie/Read"
KEEPALIVE = (10.0, 5.0)  # seconds of silence before a PING, then seconds for its answer
MAX_RECEIVE_BYTES = 256 * 1024 * 1024  # the largest answer taken
GRPC_OPTIONS = [("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
                ("grpc.http2.max_pings_without_data", 0), ("grpc.keepalive_permit_without_calls", 1),
                # a restarted bookie is found again within ~2 s, not after gRPC's 2-minute backoff
                ("grpc.initial_reconnect_backoff_ms", 200), ("grpc.min_reconnect_backoff_ms", 200),
                ("grpc.max_reconnect_backoff_ms", 2000)]


class Status(enum.IntEnum):
    """Bookie status codes (the proto's names and numbers)."""

    OK = pb.OK
    NO_LEDGER = pb.NO_LEDGER
    NO_ENTRY = pb.NO_ENTRY
    BAD_REQUEST = pb.BAD_REQUEST
    IO_ERROR = pb.IO_ERROR
    UNAUTHORIZED = pb.UNAUTHORIZED
    FENCED = pb.FENCED
    READ_ONLY = pb.READ_ONLY
    TOO_MANY_REQUESTS = pb.TOO_MANY_REQUESTS
    # the caller's credential was refused (no or an unknown one, or a role too low): an add's
    # answer, or a call that ended UNAUTHENTICATED or PERMISSION_DENIED. Every bookie would refuse.
    ACCESS_DENIED = pb.ACCESS_DENIED
    # the bookie holds this entry id with other bytes (entries are write-once): an add's answer
    ENTRY_EXISTS = pb.ENTRY_EXISTS


class BookieError(Exception):
    """A bookie answered with a status other than OK, or could not be reached."""

    def __init__(self, code: Status, message: str = "", address: str = ""):
        self.code = Status(code)
        self.message = message
        self.address = address
        super().__init__(f"{address}: {self.code.name}" + (f": {message}" if message else ""))


class BookieUnavailableError(BookieError):
    """The bookie could not be reached or the connection broke (code IO_ERROR)."""

    def __init__(self, message: str, address: str = ""):
        super().__init__(Status.IO_ERROR, message, address)


class BookieAccessDeniedError(BookieError):
    """The bookie refused this client's credential (code ACCESS_DENIED): none or an unknown one
    (`grpc_code` UNAUTHENTICATED), or a role too low for the call (PERMISSION_DENIED)."""

    def __init__(self, grpc_code: grpc.StatusCode, message: str, address: str = ""):
        self.grpc_code = grpc_code
        super().__init__(Status.ACCESS_DENIED, f"{grpc_code.name}: {message}", address)


def _denied_code(message: str) -> grpc.StatusCode:
    """The gRPC code an add's ACCESS_DENIED answer stands for (its message starts with it)."""
    return grpc.StatusCode.UNAUTHENTICATED if message.startswith("UNAUTHENTICATED") \
        else grpc.StatusCode.PERMISSION_DENIED


def add_error(status: int, message: str, address: str) -> BookieError:
    """The error of an add the bookie answered with a status other than OK."""
    if status == pb.ACCESS_DENIED:
        code = _denied_code(message)
        return BookieAccessDeniedError(code, message.removeprefix(f"{code.name}: "), address)
    return BookieError(_ERRORS.get(status, Status.IO_ERROR), message, address)


_DENIED = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)


def rpc_error(exc: grpc.aio.AioRpcError, address: str, tls: bool = False) -> BookieError:
    """The BookieError of a failed gRPC call (see status_error)."""
    return status_error(exc.code(), exc.details() or "", address, tls)


def status_error(code: grpc.StatusCode, details: str, address: str, tls: bool = False) -> BookieError:
    """The BookieError of a call that ended with `code`: access denied, or the bookie unavailable
    (with a hint when a plaintext client's connection is closed at once, as a TLS port does)."""
    if code in _DENIED:
        return BookieAccessDeniedError(code, details, address)
    hint = ""
    if not tls and code is grpc.StatusCode.UNAVAILABLE and ("Socket closed" in details or CLOSED_AT_ONCE in details):
        hint = (" (this client speaks plaintext: if the bookie serves TLS, give the client its CA, "
                "tls_ca / PYBK_TLS_CA)")
    return BookieUnavailableError(f"{code.name}: {details}{hint}", address)


_ERRORS = {s.value: s for s in Status}


def _complete(done, error: BookieError | None) -> None:
    """Complete a Future or call a callback with the add's outcome."""
    if isinstance(done, asyncio.Future):
        if not done.done():
            if error is None:
                done.set_result(None)
            else:
                done.set_exception(error)
    else:
        done(error)


RunSink = Callable[[Sequence[int], Sequence[tuple[int, "BookieError"]]], None]
"""What add_to_run calls once per answered run: (entry ids acked, (entry id, error) of the others)."""


class _Run:
    """Adds of one batch with the same ledger, key, flags and sink: one packed run on the wire,
    answered with one status (and the exceptions). `dones` holds per-entry callbacks (add_callback)."""

    __slots__ = ("rid", "ledger_id", "master_key", "flags", "sink", "dones", "entry_ids", "bodies", "size")

    def __init__(self, ledger_id: int, master_key: bytes, flags: int, sink: RunSink | None):
        self.rid = 0
        self.ledger_id = ledger_id
        self.master_key = master_key
        self.flags = flags
        self.sink = sink
        self.dones: list | None = None if sink is not None else []
        self.entry_ids: list[int] = []
        self.bodies: list[bytes] = []
        self.size = 0

    def settle(self, status: int, message: str, failures, address: str) -> None:
        """Complete every add of the run: `status` (with `message`) for all but `failures`,
        (index in the run, status, message) each; a failure without a message repeats the one of
        an earlier failure of the same status."""
        ids = self.entry_ids
        if status == 0 and not failures:
            if self.sink is not None:
                self.sink(ids, ())
            else:
                for done in self.dones:
                    _complete(done, None)
            return
        base = None if status == 0 else add_error(status, message, address)
        outcome: list[BookieError | None] = [base] * len(ids)
        said: dict[int, str] = {}
        for k, st, msg in failures:
            if 0 <= k < len(ids):
                if msg:
                    said.setdefault(st, msg)
                else:
                    msg = said.get(st, "")
                outcome[k] = None if st == 0 else add_error(st, msg, address)
        self._complete(outcome)

    def fail(self, error: "BookieError") -> None:
        """Complete every add of the run with `error`."""
        self._complete([error] * len(self.entry_ids))

    def _complete(self, outcome: list) -> None:
        if self.sink is not None:
            ids = self.entry_ids
            self.sink([e for e, o in zip(ids, outcome) if o is None],
                      [(e, o) for e, o in zip(ids, outcome) if o is not None])
        else:
            for done, o in zip(self.dones, outcome):
                _complete(done, o)


class BookieClient:
    """One gRPC channel to one bookie. Create with `await BookieClient.connect("host:port")`."""

    def __init__(self, address: str, max_batch_bytes: int = 1024 * 1024, max_batch_entries: int = 8192,
                 timeout: float = 30.0, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 security: ClientSecurity | None = None, token: str | None = None,
                 keepalive: tuple[float, float] = KEEPALIVE):
        """max_message_bytes matches the bookies' max_message_size: no Add message is bigger, and
        an entry that cannot fit in one is refused here with BAD_REQUEST. `keepalive` is (seconds
        of silence before a PING, seconds for its answer): a bookie that is connected but stalled
        fails the calls in flight UNAVAILABLE after their sum. With `security` the
        channel uses TLS (when it names a CA) and every call carries its bearer token (read from
        its token file now, or `token` if given); CertificateError or OSError names a file that
        cannot be used."""
        self.address = address
        self.max_batch_bytes = max_batch_bytes
        self.max_batch_entries = max_batch_entries
        self.timeout = timeout
        self.max_message_bytes = max_message_bytes
        self._batch_room = max_message_bytes - (max_batch_entries + 1) * _ENTRY_OVERHEAD  # body bytes per batch
        self.keepalive = keepalive
        options = [*GRPC_OPTIONS, ("grpc.max_send_message_length", max_message_bytes),
                   ("grpc.keepalive_time_ms", int(keepalive[0] * 1000)),
                   ("grpc.keepalive_timeout_ms", int(keepalive[1] * 1000))]
        self.security = security or ClientSecurity()
        token = token or self.security.token()
        self._metadata = (("authorization", f"Bearer {token}"),) if token else None
        if self.security.tls:
            from pybk.security.tls import client_channel_credentials
            credentials, extra = client_channel_credentials(self.security)
            self._channel = grpc.aio.secure_channel(address, credentials, options=options + extra)
        else:
            self._channel = grpc.aio.insecure_channel(address, options=options)
        self._stub = rpc.BookieStub(self._channel)
        # Read with the PACKED answers' bodies left where they were received (wire.read_results)
        self._read_views = self._channel.unary_stream(READ_METHOD,
                                                      request_serializer=pb.ReadRequest.SerializeToString,
                                                      response_deserializer=wire.read_results,
                                                      _registered_method=True)
        self._ssl: ssl.SSLContext | None = None  # the Add and Read streams' (each has its own connection)
        self._runs: list[_Run] = []  # the batch being built
        self._open: dict[tuple, _Run] = {}  # its runs by (ledger, key, flags, sink)
        self._run: _Run | None = None  # the run of its last add
        self._pending = 0         # entries in the batch being built
        self._pending_bytes = 0
        self._next_id = 1
        self._inflight = 0
        self._flush_scheduled = False
        self._stream: _AddStream | None = None
        self._closed = False
        self._event_loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    async def connect(cls, address: str, wait: float | None = None, **kwargs) -> "BookieClient":
        """A client for the bookie at host:port. Connects lazily; pass wait=seconds to wait until
        the bookie is reachable (raises BookieUnavailableError otherwise). Pass security= for TLS
        and a bearer token (see __init__)."""
        client = cls(address, **kwargs)
        if wait:
            try:
                await asyncio.wait_for(client._channel.channel_ready(), wait)
            except asyncio.TimeoutError:
                await client.close()
                raise BookieUnavailableError(f"not reachable within {wait}s", address) from None
        return client

    async def close(self) -> None:
        """Fail pending adds and close the channel."""
        self._closed = True
        if self._stream is not None:
            self._stream.fail(BookieUnavailableError("client closed", self.address))
            self._stream = None
        self._fail_pending(BookieUnavailableError("client closed", self.address))
        await self._channel.close()

    async def __aenter__(self) -> "BookieClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # ---- adds -------------------------------------------------------------------------------

    def add_nowait(self, ledger_id: int, entry_id: int, body: bytes, master_key: bytes,
                   recovery: bool = False) -> asyncio.Future:
        """Queue an add; returns a future that completes when the bookie has it durably (or fails
        with BookieError)."""
        fut = self._loop().create_future()
        self.add_callback(ledger_id, entry_id, body, master_key, recovery, fut)
        return fut

    def add_callback(self, ledger_id: int, entry_id: int, body: bytes, master_key: bytes, recovery: bool,
                     done: "asyncio.Future | Callable[[BookieError | None], None]") -> None:
        """Queue an add and call done(None) once it is durable, or done(BookieError) (done may also be
        a Future). Callbacks run straight from the receive loop, with no Future or task per add:
        the cheapest way to keep very many adds in flight. A callback must not raise or block."""
        if self._closed:
            _complete(done, BookieUnavailableError("client closed", self.address))
            return
        run = self._append(ledger_id, entry_id, body, master_key, recovery, None)
        if run.__class__ is not _Run:
            _complete(done, run)
            return
        run.dones.append(done)
        self._appended(len(body))

    def add_to_run(self, ledger_id: int, entry_id: int, body: bytes, master_key: bytes, recovery: bool,
                   sink: RunSink) -> None:
        """Queue an add whose outcome goes to sink(acked ids, [(id, BookieError)]), called once for
        every run of adds with the same ledger, key, flags and sink (the same object) that went out
        together: no callback per add. The body is sent as it is (no copy until the batch is
        encoded). A sink must not raise or block."""
        if self._closed:
            sink((), ((entry_id, BookieUnavailableError("client closed", self.address)),))
            return
        size = len(body)
        run = self._run
        if run is None or run.sink is not sink or run.ledger_id != ledger_id or run.flags != recovery \
                or self._pending_bytes + size > self._batch_room or size < HEADER_SIZE \
                or (run.master_key is not master_key and run.master_key != master_key):
            run = self._append(ledger_id, entry_id, body, master_key, recovery, sink)
            if run.__class__ is not _Run:
                sink((), ((entry_id, run),))
                return
        else:  # the hot path: one more add of the batch's last run
            run.entry_ids.append(entry_id)
            run.bodies.append(body)
            run.size += size
        self._appended(size)

    def _append(self, ledger_id: int, entry_id: int, body: bytes, master_key: bytes, recovery: bool,
                sink: RunSink | None) -> "_Run | BookieError":
        """Put an add into the batch being built (its run), or the BAD_REQUEST of a body that no
        bookie would take: too big for a message, or shorter than an entry header (in a packed
        run it would make the bookie refuse the whole run as malformed)."""
        size = len(body)
        if size < HEADER_SIZE:
            return BookieError(Status.BAD_REQUEST, f"entry {ledger_id}:{entry_id} of {size} bytes is shorter than "
                               f"an entry header ({HEADER_SIZE} bytes)", self.address)
        if self._pending_bytes + size > self._batch_room:
            if size > self._batch_room:
                return self._too_big(ledger_id, entry_id, size)
            self._flush()
        flags = 1 if recovery else 0
        key = (ledger_id, master_key, flags, sink)
        run = self._open.get(key)
        if run is None:  # adds of a ledger join its run even when other ledgers' adds came between
            run = self._open[key] = _Run(ledger_id, master_key, flags, sink)
            self._runs.append(run)
        self._run = run
        run.entry_ids.append(entry_id)
        run.bodies.append(body)
        run.size += size
        return run

    @property
    def busy(self) -> bool:
        """A batch of adds is in flight: an add queued now goes out once it is answered."""
        return self._inflight > 0

    def _appended(self, size: int) -> None:
        self._pending += 1
        self._pending_bytes += size
        if self._pending_bytes >= self.max_batch_bytes or self._pending >= self.max_batch_entries:
            self._flush()
        elif self._inflight == 0 and not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop().call_soon(self._flush)

    def _too_big(self, ledger_id: int, entry_id: int, size: int) -> BookieError:
        return BookieError(Status.BAD_REQUEST, f"entry {ledger_id}:{entry_id} of {size} bytes does not fit the max "
                           f"message size of {self.max_message_bytes} bytes", self.address)

    def _loop(self) -> asyncio.AbstractEventLoop:
        loop = self._event_loop
        if loop is None:
            loop = self._event_loop = asyncio.get_running_loop()
        return loop

    async def add(self, ledger_id: int, entry_id: int, body: bytes, *, master_key: bytes,
                  recovery: bool = False) -> None:
        """Store one entry (the encoded body) on this bookie; returns once it is durable there."""
        await self.add_nowait(ledger_id, entry_id, body, master_key, recovery)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if not self._pending:
            return
        runs = self._runs
        rid = self._next_id
        for run in runs:  # a run takes a request id per entry: the AddEntry form numbers its entries so
            run.rid = rid
            rid += len(run.entry_ids)
        self._next_id = rid
        self._new_batch()
        if self._stream is None or self._stream.broken:
            self._stream = _AddStream(self.address, metadata=self._metadata or (), ssl=self._ssl_context(),
                                      server_hostname=self.security.tls_server_name, tls=self.security.tls,
                                      keepalive=self.keepalive, on_batch_done=self._batch_done,
                                      on_broken=self._stream_broken)
        self._inflight += 1
        self._stream.send(runs)

    def _batch_done(self) -> None:
        self._inflight -= 1
        if self._pending and not self._flush_scheduled:
            self._flush()

    def _stream_broken(self, stream: "_AddStream", failed: int) -> None:
        """`stream` failed its `failed` batches in flight: the next batch opens a new one."""
        self._inflight -= failed
        if self._stream is stream:
            self._stream = None
        if self._pending and self._inflight == 0 and not self._closed:
            self._flush()

    def _new_batch(self) -> None:
        self._runs = []
        self._open = {}
        self._run = None
        self._pending = 0
        self._pending_bytes = 0

    def _fail_pending(self, exc: BookieError) -> None:
        runs = self._runs
        self._new_batch()
        for run in runs:
            run.fail(exc)

    # ---- reads ------------------------------------------------------------------------------

    async def read(self, ledger_id: int, entry_id: int) -> bytes:
        """One entry's body; raises BookieError (NO_LEDGER, NO_ENTRY, ...). A call on the shared
        channel: a connection of its own (as range reads have) would cost more than the read."""
        req = pb.ReadRequest(ledger_id=ledger_id, first_entry=entry_id, last_entry=entry_id, step=1, flags=pb.PACKED)
        async with aclosing(self._answers(req, views=True, own=False)) as answers:
            async for res, bodies in answers:
                for _, bodies, sizes in self._unpacked(res, bodies):
                    return bytes(bodies[:sizes[0]])
        raise BookieError(Status.NO_ENTRY, f"entry {ledger_id}:{entry_id} not returned", self.address)

    async def read_range(self, ledger_id: int, first: int, last: int, step: int = 1
                         ) -> AsyncIterator[tuple[int, bytes]]:
        """Entries first, first+step, ... <= last in order as (entry_id, body); raises BookieError
        at the first one this bookie does not hold (after yielding those before it). step = E
        reads a striped replica's share (every E-th entry)."""
        async for eid, bodies, sizes in self.read_packed(ledger_id, first, last, step):
            pos = 0
            for i, size in enumerate(sizes.tolist()):
                yield eid + i * step, bytes(bodies[pos:pos + size])
                pos += size

    async def read_packed(self, ledger_id: int, first: int, last: int, step: int = 1, digests_checked: bool = False
                          ) -> AsyncIterator[tuple[int, bytes | memoryview, np.ndarray]]:
        """read_range as it arrives: (first entry id, bodies back to back, their sizes), one per
        answer of the bookie (up to a few MiB each), without an object per entry; the bodies are a
        read-only view of the answer as received, not a copy. Entries are first_id, first_id +
        step, ...; raises BookieError like read_range. A caller that checks every body's digest
        itself says so (digests_checked): the bookie then skips its record checksums, the same
        check done twice. A call on a connection of its own, but over TLS on the channel (_answers)."""
        if step < 1:
            raise ValueError(f"step must be >= 1, not {step}")
        flags = pb.PACKED | (pb.DIGESTS_CHECKED if digests_checked else 0)
        req = pb.ReadRequest(ledger_id=ledger_id, first_entry=first, last_entry=last, step=step, flags=flags)
        async with aclosing(self._answers(req, views=True, own=not self.security.tls)) as answers:
            async for res, bodies in answers:
                for answer in self._unpacked(res, bodies):
                    yield answer

    async def _answers(self, req: pb.ReadRequest, views: bool, own: bool, timeout: float | None = None
                       ) -> AsyncIterator:
        """A Read call's answers, as wire.read_results reads them (`views`) or as ReadResults. With
        `own`, on a connection of its own (_read_stream), else on the channel: over TLS a
        connection per call costs its handshake, 1.4 ms of CPU (a read of 5 entries: 2.0 ms
        against 0.6 ms), more than the own transport saves on a range of a few MB (0.3 ms a MB).
        A bookie whose new connection fails before it speaks HTTP/2 (refused, reset or closed at
        once, as at its connection limit) is asked again on the channel, whose connection it may
        hold already."""
        if own:
            call = self._read_stream(req, timeout)
            decode = wire.read_results if views else pb.ReadResults.FromString
            taken = False
            try:
                async for message in call:
                    taken = True
                    yield self._decoded(decode, message)
                return
            except CallError as exc:
                if taken or call.spoke:
                    raise status_error(exc.code, exc.details, self.address, self.security.tls) from None
            finally:
                call.cancel()
        call = (self._read_views if views else self._stub.Read)(req, timeout=timeout, metadata=self._metadata)
        try:
            async for answer in call:
                yield answer
        except grpc.aio.AioRpcError as exc:
            raise self._rpc_error(exc) from None
        finally:
            call.cancel()

    def _check(self, res) -> None:
        """BookieError for an answer whose status is not OK (its status and message)."""
        if res.status != pb.OK:
            raise BookieError(_ERRORS.get(res.status, Status.IO_ERROR), res.message, self.address)

    def _decoded(self, decode: Callable, message: bytes | memoryview):
        """decode(message), a Read call's answer; BookieUnavailableError for one it cannot decode."""
        try:
            return decode(message)
        except DecodeError as exc:
            raise BookieUnavailableError(f"an answer that is not a ReadResults: {exc}", self.address) from None

    def _unpacked(self, res: pb.ReadResults, bodies: memoryview
                  ) -> Iterator[tuple[int, bytes | memoryview, np.ndarray]]:
        """A read's answer as read_packed yields it (its entries, if any, in one piece), then
        BookieError for a status other than OK: the entries before the error are taken first."""
        if res.body_sizes:
            yield res.first_body_entry, bodies, np.array(res.body_sizes, np.int64)
        elif res.entries:  # a bookie from before PACKED
            yield (res.entries[0].entry_id, b"".join(e.body for e in res.entries),
                   np.array([len(e.body) for e in res.entries], np.int64))
        self._check(res)

    async def _lac_answer(self, req: pb.ReadRequest, timeout: float) -> pb.ReadResults:
        """The one answer of a LAC read (first_entry -1); BookieError unless its status is OK."""
        try:
            call = self._stub.Read(req, timeout=timeout, metadata=self._metadata)
            async for res in call:
                self._check(res)
                return res
        except grpc.aio.AioRpcError as exc:
            raise self._rpc_error(exc) from None
        raise BookieError(Status.IO_ERROR, "empty answer", self.address)

    async def _read_lac_call(self, req: pb.ReadRequest, timeout: float) -> int:
        return (await self._lac_answer(req, timeout)).lac

    async def fence(self, ledger_id: int, master_key: bytes) -> int:
        """Fence the ledger on this bookie (durable before it answers); returns the bookie's LAC
        (-1 if it holds no entries of the ledger)."""
        req = pb.ReadRequest(ledger_id=ledger_id, first_entry=-1, last_entry=-1, flags=pb.FENCE,
                             master_key=master_key)
        return await self._read_lac_call(req, self.timeout)

    async def read_lac(self, ledger_id: int) -> int:
        """The bookie's LAC for the ledger; BookieError(NO_LEDGER) if it knows nothing of it."""
        try:
            res = await self._stub.ReadLac(pb.ReadLacRequest(ledger_id=ledger_id), timeout=self.timeout,
                                           metadata=self._metadata)
        except grpc.aio.AioRpcError as exc:
            raise self._rpc_error(exc) from None
        self._check(res)
        return res.lac

    async def wait_lac(self, ledger_id: int, previous: int, timeout: float) -> int:
        """Long-poll: the LAC as soon as it passes `previous`, or the current one after timeout."""
        req = pb.ReadRequest(ledger_id=ledger_id, first_entry=-1, last_entry=-1, flags=pb.LONG_POLL,
                             previous_lac=previous, timeout_ms=max(int(timeout * 1000), 1))
        return await self._read_lac_call(req, timeout + self.timeout)

    async def follow_lac(self, ledger_id: int, previous: int, timeout: float
                         ) -> AsyncIterator[tuple[int, int, bytes, list[int]]]:
        """The bookie's LAC each time it passes the last one told (`previous` first), with the
        entries after that one it holds up to the new LAC (readLastAddConfirmedAndEntry, one call
        for every LAC of `timeout` seconds): (LAC, the first entry's id, their bodies back to back,
        their sizes; maybe none). Ends after `timeout` (with the LAC then), or after one answer
        from a bookie that does not follow; BookieError as wait_lac. The caller checks every
        body's digest (the bookie skips its record checksums)."""
        req = pb.ReadRequest(ledger_id=ledger_id, first_entry=-1, last_entry=-1, previous_lac=previous,
                             flags=pb.LONG_POLL | pb.FOLLOW | pb.PACKED | pb.DIGESTS_CHECKED,
                             timeout_ms=max(int(timeout * 1000), 1))
        async with aclosing(self._answers(req, views=False, own=True, timeout=timeout + self.timeout)) as answers:
            async for res in answers:
                self._check(res)
                if res.body_sizes:   # (a few sizes: a list costs less than an array)
                    yield res.lac, res.first_body_entry, res.bodies, list(res.body_sizes)
                else:
                    yield res.lac, res.lac + 1, b"", []

    async def write_lac(self, ledger_id: int, lac: int, master_key: bytes) -> None:
        """Record an explicit LAC on this bookie."""
        try:
            res = await self._stub.WriteLac(pb.WriteLacRequest(ledger_id=ledger_id, lac=lac, master_key=master_key),
                                            timeout=self.timeout, metadata=self._metadata)
        except grpc.aio.AioRpcError as exc:
            raise self._rpc_error(exc) from None
        self._check(res)

    async def list_entries(self, ledger_id: int) -> list[tuple[int, int]]:
        """Inclusive (first, last) ranges of the entry ids this bookie holds for the ledger
        ([] if it holds none)."""
        try:
            res = await self._stub.ListEntries(pb.ListEntriesRequest(ledger_id=ledger_id), timeout=self.timeout,
                                               metadata=self._metadata)
        except grpc.aio.AioRpcError as exc:
            raise self._rpc_error(exc) from None
        if res.status == pb.NO_LEDGER:
            return []
        self._check(res)
        return [(r.first, r.last) for r in res.ranges]

    async def list_ledgers(self) -> list[int]:
        try:
            res = await self._stub.ListLedgers(pb.ListLedgersRequest(), timeout=self.timeout,
                                               metadata=self._metadata)
        except grpc.aio.AioRpcError as exc:
            raise self._rpc_error(exc) from None
        return list(res.ledger_ids)

    async def info(self) -> dict:
        """bookie_id, read_only, free_bytes, total_bytes, version, zone, ledger_count, and who the
        bookie takes this client for: caller (a name) and caller_role (reader, writer or admin)."""
        try:
            res = await self._stub.Info(pb.InfoRequest(), timeout=self.timeout, metadata=self._metadata)
        except grpc.aio.AioRpcError as exc:
            raise self._rpc_error(exc) from None
        return {"bookie_id": res.bookie_id, "read_only": res.read_only, "free_bytes": res.free_bytes,
                "total_bytes": res.total_bytes, "version": res.version, "zone": res.zone,
                "ledger_count": res.ledger_count, "caller": res.caller, "caller_role": res.caller_role}

    def _read_stream(self, req: pb.ReadRequest, timeout: float | None = None) -> ServerStream:
        """A Read call on a connection of its own, its answers taken on the loop (transport.ngh2_client:
        grpc.aio's receive cost a third of a scan's Python CPU), with the channel's TLS, token and
        keepalive; it ends DEADLINE_EXCEEDED after `timeout` seconds."""
        return ServerStream(self.address, READ_METHOD, req.SerializeToString(), metadata=self._metadata or (),
                            ssl=self._ssl_context(), server_hostname=self.security.tls_server_name,
                            max_receive_message_bytes=MAX_RECEIVE_BYTES, keepalive=self.keepalive[0],
                            keepalive_timeout=self.keepalive[1], timeout=timeout)

    def _ssl_context(self) -> "ssl.SSLContext | None":
        """The TLS context of Add and Read streams (None for plaintext), made once: the same CA, client
        certificate and expected server name as the channel's."""
        if self.security.tls and self._ssl is None:
            from pybk.security.tls import client_ssl_context
            self._ssl = client_ssl_context(self.security)
        return self._ssl

    def _rpc_error(self, exc: grpc.aio.AioRpcError) -> BookieError:
        return rpc_error(exc, self.address, self.security.tls)


def _encode(runs: list[_Run], packed: bool) -> bytes:
    """The AddBatch of runs: packed runs, or (a bookie from before them) an AddEntry per add,
    numbered from its run's request id."""
    if packed:
        parts: list = []
        for r in runs:
            wire.add_run_parts(parts, r.rid, r.ledger_id, r.master_key, r.flags, r.entry_ids, r.bodies, r.size)
        return b"".join(parts)
    batch = pb.AddBatch()
    add = batch.entries.add
    for r in runs:
        for k, (eid, body) in enumerate(zip(r.entry_ids, r.bodies)):
            add(request_id=r.rid + k, ledger_id=r.ledger_id, entry_id=eid, master_key=r.master_key,
                flags=r.flags, body=body)
    return batch.SerializeToString()


class _AddStream:
    """One Add bidi stream on its own HTTP/2 connection (transport.ngh2_client.ClientStream: no grpc.aio
    on the hot path): batches (lists of runs) are encoded and written as they come, packed once the bookie
    said it takes runs; each answer settles its batch's runs, straight from the read callback."""

    def __init__(self, address: str, *, metadata: Sequence[tuple[str, str]], ssl: "ssl.SSLContext | None",
                 server_hostname: str | None, tls: bool, keepalive: tuple[float, float],
                 on_batch_done: Callable[[], None], on_broken: Callable[["_AddStream", int], None]):
        """`on_batch_done()` once per batch answered (or refused before it was sent);
        `on_broken(stream, n)` once the stream failed, with the n batches it failed."""
        self.address, self.tls = address, tls
        self._on_batch_done, self._on_broken = on_batch_done, on_broken
        self.inflight: dict[int, list[_Run]] = {}  # first run's request id -> the batch's runs
        self.broken = False
        self.packed = False  # until the bookie's initial metadata says it takes packed runs
        self.rpc = ClientStream.open(address, ADD_METHOD, metadata=metadata, ssl=ssl, server_hostname=server_hostname,
                                     on_message=self._answer, on_headers=self._announced, on_end=self._ended,
                                     awaiting=lambda: bool(self.inflight), keepalive=keepalive[0],
                                     keepalive_timeout=keepalive[1])

    def _announced(self, headers: list) -> None:
        """The bookie's initial metadata: a bookie from before packed runs does not name them
        (and sends its metadata only with its first answer; batches go as AddEntry until then)."""
        self.packed = any(k == ADD_RUNS_HEADER for k, _ in headers)

    def send(self, runs: list[_Run]) -> None:
        try:
            data = _encode(runs, self.packed)
        except (TypeError, ValueError, OverflowError) as exc:  # not representable on the wire
            error = BookieError(Status.BAD_REQUEST, f"bad add: {exc}", self.address)
            for run in runs:
                run.fail(error)
            self._on_batch_done()  # send is the last step of _flush: this may flush the next batch
            return
        self.inflight[runs[0].rid] = runs
        self.rpc.write(data)

    def _answer(self, data: bytes) -> None:
        address = self.address
        try:
            results = pb.AddResults.FromString(data)
            answers = results.runs
            if answers:
                runs = self.inflight.pop(answers[0].request_id, None)
                if runs is not None:
                    for run, res in zip(runs, answers):
                        failures = res.failures
                        run.settle(res.status, res.message, [(f.index, f.status, f.message) for f in failures]
                                   if failures else (), address)
            elif results.results:
                entries = results.results
                runs = self.inflight.pop(entries[0].request_id, None)
                pos = 0
                for run in runs or ():
                    n = len(run.entry_ids)
                    run.settle(0, "", [(k, r.status, r.message) for k, r in enumerate(entries[pos:pos + n])
                                       if r.status], address)
                    pos += n
            else:
                raise ValueError("an answer naming no add")
        except Exception as exc:  # noqa: BLE001 - never leave an add hanging
            self.fail(BookieUnavailableError(f"add stream failed: {exc}", address))
            return
        self._on_batch_done()

    def _ended(self, code: grpc.StatusCode, details: str) -> None:
        if code is grpc.StatusCode.OK:
            self.fail(BookieUnavailableError("add stream ended", self.address))
        else:
            self.fail(status_error(code, details, self.address, self.tls))

    def fail(self, exc: BookieError) -> None:
        """Fail every add sent on this stream and not yet answered."""
        if self.broken and not self.inflight:
            return
        self.broken = True
        self.rpc.cancel()
        batches = list(self.inflight.values())
        self.inflight.clear()
        for runs in batches:
            for run in runs:
                run.fail(exc)
        self._on_broken(self, len(batches))
