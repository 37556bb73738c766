"""The gRPC service `pybk.Bookie`: translates batched requests into storage calls.

Every handler answers bad input with a status (BAD_REQUEST, NO_LEDGER, ...) and never lets one
client's request take the server down.
"""
from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from dataclasses import replace
from time import monotonic

import grpc
from google.protobuf.message import DecodeError
from prometheus_client import Counter

from pybk import __version__
from pybk.proto import pb, rpc, wire
from pybk.security.auth import AccessDenied, Authenticator, Denial
from pybk.security.roles import OPEN, Operation, Principal
from pybk.transport.grpc_server import ConnectionLimits, Kind, Method, Server, Throttled

from .add_stream import AddStream, InFlight
from .limits import Limits, message_limit
from .bookie import Bookie, BookieStorageError
from .keys import KeyGate
from .readbuffer import ReadBuffer
from .state import KEY_MISSING, needs_admission

log = logging.getLogger("pybk.bookie.service")
# refused calls are as many as a client likes: a line per kind a minute
noted = Throttled(logger=log)

READ_BATCH_BYTES = 1024 * 1024        # bodies per read answer of ReadEntry messages
PACKED_BATCH_BYTES = 3 * 1024 * 1024  # bodies per PACKED answer (at most a third of max_message_size): 1 -> 4
                                      # MiB cut the bookies' CPU per entry read by ~20% (fewer gRPC writes)
READ_BATCH_ENTRIES = 4096
TAIL_BATCH_BYTES = 1024 * 1024        # bodies a PACKED LAC answer carries at most (a tailing reader's new entries)
MAX_LONG_POLL_MS = 60_000
MAX_READ_STEP = 1 << 16  # strides beyond any sane ensemble size are refused


class BookieService(rpc.BookieServicer):
    """Servicer over one storage core."""

    def __init__(self, bookie: Bookie, bookie_id: str, zone: str = "", version: str = __version__,
                 limits: Limits = Limits(), authenticator: Authenticator | None = None,
                 keys: KeyGate | None = None):
        self.bookie = bookie
        self.authenticator = authenticator
        self.keys = keys  # first keys of ledgers are checked against the metadata (None: no metadata)
        self.bookie_id = bookie_id
        self.zone = zone
        self.version = version
        self.limits = replace(limits, max_message_size=message_limit(limits.max_message_size,
                                                                     bookie.opts.max_entry_size))
        self.adds_in_flight = InFlight()
        self.read_buffer = ReadBuffer(limits.max_read_buffer_bytes, limits.read_stream_timeout)
        # a PACKED answer holds up to this much plus one body, so it stays within the message limit
        self.packed_batch_bytes = max(READ_BATCH_BYTES, min(PACKED_BATCH_BYTES, limits.max_message_size // 3))

    def _decide(self, context, operation: Operation) -> tuple[Principal | None, grpc.StatusCode | None, str]:
        """(the caller's Principal, None, "") if its role allows `operation` (OPEN when
        authentication is off), else (None, UNAUTHENTICATED or PERMISSION_DENIED, why). The one
        place a bookie decides who may do what; every RPC asks it first."""
        auth = self.authenticator
        if auth is None or not auth.enabled:
            return OPEN, None, ""
        try:
            return auth.authorize_grpc(context, operation), None, ""
        except AccessDenied as exc:
            noted.emit(logging.INFO, f"refused {operation.value}", f"refused {operation.value} from {context.peer()}: "
                                                                  f"{exc.message}")
            code = grpc.StatusCode.UNAUTHENTICATED if exc.denial is Denial.UNAUTHENTICATED \
                else grpc.StatusCode.PERMISSION_DENIED
            self.bookie.metrics.denied.labels(operation.value, code.name).inc()
            return None, code, f"{operation.value} refused: {exc.message}"

    def identifies(self, context) -> bool:
        """Whether a call carries a credential this bookie knows (any role; True with authentication
        off): its connection is then given its full flow-control window and memory budget."""
        auth = self.authenticator
        return auth is None or auth.knows_grpc(context)

    async def _authorize(self, context, operation: Operation) -> Principal:
        """The caller's Principal if it may perform `operation`; otherwise the call ends
        UNAUTHENTICATED or PERMISSION_DENIED, the message naming the cause."""
        principal, code, why = self._decide(context, operation)
        if principal is None:
            await context.abort(code, why)
        return principal

    def _authorize_stream(self, context, operation: Operation) -> tuple[Principal | None, str]:
        """For the Add stream: (Principal, "") or (None, why), why starting with the gRPC code's
        name, as the message of the ACCESS_DENIED answers."""
        principal, code, why = self._decide(context, operation)
        return principal, "" if principal is not None else f"{code.name}: {why}"

    # ---- ledger rights: first keys checked against the metadata, keyless recovery for admins ----

    async def _admit(self, ledger: int, key: bytes) -> tuple[int, str]:
        """(OK, "") or why not, for a fence or WriteLac whose key this bookie would record first."""
        if self.keys is None or not needs_admission(self.bookie.ledgers.get(ledger), key):
            return pb.OK, ""
        return await self.keys.check(ledger, key)

    async def Add(self, request_iterator, context):
        """Each incoming batch is journaled as it arrives; results go back as each becomes
        durable, one AddResults per AddBatch (add_stream.AddStream)."""
        stream = AddStream(self.bookie, self.keys, self.limits, self.adds_in_flight,
                           lambda: self._authorize_stream(context, Operation.ADD), context)
        await stream.run(request_iterator)

    async def Read(self, request, context):
        """Answers go out one at a time, each built only after the previous one was taken: a
        client that stops reading pauses its stream, and the room its answers hold in the
        bookie's ReadBuffer is bounded (see there)."""
        principal = await self._authorize(context, Operation.FENCE if request.flags & pb.FENCE else Operation.READ)
        bookie = self.bookie
        ledger, first, last = request.ledger_id, request.first_entry, request.last_entry
        m = bookie.metrics
        try:
            if request.flags & pb.FENCE:
                key = request.master_key
                status, why = await self._admit(ledger, key)
                if status == pb.OK:
                    keyless = not key and principal.may(Operation.KEYLESS_RECOVERY)
                    status, lac = await bookie.fence(ledger, key, keyless)
                    why = KEY_MISSING if status == pb.BAD_REQUEST else _why(status, ledger)
                if status != pb.OK:
                    m.read_errors.labels(pb.Status.Name(status)).inc()
                    await context.write(pb.ReadResults(status=status, message=why, lac=-1))
                    return
                if first < 0:
                    await context.write(pb.ReadResults(status=pb.OK, lac=lac))
                    return
            if first < 0:
                await self._read_lac(context, request)
                return
            if last < first:
                await context.write(pb.ReadResults(status=pb.BAD_REQUEST, lac=-1,
                                                   message=f"bad range [{first}, {last}]: last must be >= first >= 0"))
                return
            step = request.step or 1
            if step > MAX_READ_STEP:
                m.read_errors.labels("BAD_REQUEST").inc()
                await context.write(pb.ReadResults(
                    status=pb.BAD_REQUEST, lac=-1,
                    message=f"bad step {step}: must be 0 or 1 (every entry) up to {MAX_READ_STEP}"))
                return
            m.read_requests.inc()
            lac = bookie.lac(ledger)
            if lac is None:
                m.read_errors.labels("NO_LEDGER").inc()
                await context.write(pb.ReadResults(status=pb.NO_LEDGER, message=_why(pb.NO_LEDGER, ledger), lac=-1))
                return
            started = monotonic()
            try:
                await self._stream_entries(context, ledger, first, last, step, lac,
                                           bool(request.flags & pb.PACKED), not request.flags & pb.DIGESTS_CHECKED)
            finally:  # a reader that stops once it has what it needs cancels the stream: still a read
                m.read_latency.observe(monotonic() - started)
        except (BookieStorageError, OSError) as exc:
            log.error("read %d:[%d,%d] failed: %s", ledger, first, last, exc,
                      extra={"ledger_id": ledger, "entry_range": [first, last]})
            await context.write(pb.ReadResults(status=pb.IO_ERROR, message=str(exc), lac=-1))

    async def _read_lac(self, context, request) -> None:
        """A LAC read: the LAC now, or with LONG_POLL once it passes previous_lac (the current one
        at timeout_ms), with PACKED the entries after previous_lac too; with FOLLOW again at each
        rise of the LAC past the last one answered, until timeout_ms in all."""
        bookie, ledger, previous, flags = self.bookie, request.ledger_id, request.previous_lac, request.flags
        timeout = min(request.timeout_ms or 10_000, MAX_LONG_POLL_MS) / 1000
        deadline = monotonic() + timeout
        while True:
            if flags & pb.LONG_POLL:
                lac = await bookie.wait_lac(ledger, previous, max(0.0, deadline - monotonic()))
            else:
                lac = bookie.lac(ledger)
            if lac is None:
                await context.write(pb.ReadResults(status=pb.NO_LEDGER, message=_why(pb.NO_LEDGER, ledger), lac=-1))
                return
            if flags & pb.PACKED and lac > previous:
                await self._lac_and_entries(context, ledger, lac, max(previous + 1, 0), not flags & pb.DIGESTS_CHECKED)
            elif flags & pb.FOLLOW:   # a client that takes no answer is cancelled by the read buffer's sweeper
                await self.read_buffer.send(context, pb.ReadResults(status=pb.OK, lac=lac), 0)
            else:
                await context.write(pb.ReadResults(status=pb.OK, lac=lac))
            if not flags & pb.FOLLOW or not flags & pb.LONG_POLL or lac <= previous or monotonic() >= deadline:
                return
            previous = lac

    async def _lac_and_entries(self, context, ledger: int, lac: int, first: int, checked: bool) -> None:
        """The LAC, with the bodies of the entries from `first` up to it that this bookie holds
        (consecutive, at most TAIL_BATCH_BYTES plus one body) packed in the same answer, as
        BookKeeper's readLastAddConfirmedAndEntry: a tailing reader needs no second round trip for
        the entries it was woken for. Without room in the read buffer now, or when they cannot be
        read, the answer is the LAC alone (the reader then reads them as usual)."""
        buffer = self.read_buffer
        out = pb.ReadResults(status=pb.OK, lac=lac)
        if not buffer.try_reserve(TAIL_BATCH_BYTES):
            await context.write(out)
            return
        answer: pb.ReadResults | bytes = out
        try:
            try:
                bodies = await self.bookie.read_bodies(ledger, first, lac, TAIL_BATCH_BYTES, READ_BATCH_ENTRIES, 1,
                                                       checked)
            except (BookieStorageError, OSError) as exc:
                log.info("LAC answer of ledger %d without entries from %d: %s", ledger, first, exc,
                         extra={"ledger_id": ledger})
                bodies = []
            if bodies:
                m = self.bookie.metrics
                m.reads.inc(len(bodies))
                m.read_bytes.inc(sum(map(len, bodies)))
                out.first_body_entry = first
                answer = wire.encode_packed(out, bodies)
        except BaseException:
            buffer.release(TAIL_BATCH_BYTES)
            raise
        await buffer.send(context, answer, TAIL_BATCH_BYTES)

    async def _stream_entries(self, context, ledger: int, first: int, last: int, step: int, lac: int,
                              packed: bool, checked: bool) -> None:
        """Answers of up to 1 MiB of bodies (PACKED: packed_batch_bytes): packed into one buffer when the client
        asked for PACKED, else one ReadEntry each (clients from before PACKED). Record checksums are
        checked unless the client said it checks the entries' digests (DIGESTS_CHECKED)."""
        bookie, buffer = self.bookie, self.read_buffer
        batch_bytes = self.packed_batch_bytes if packed else READ_BATCH_BYTES
        m = bookie.metrics
        eid = first
        while True:
            if not await buffer.reserve(batch_bytes):
                m.read_errors.labels("TOO_MANY_REQUESTS").inc()
                await buffer.send(context, pb.ReadResults(
                    status=pb.TOO_MANY_REQUESTS, lac=-1, message=f"read buffer full ({buffer.limit} bytes of "
                    f"answers waiting for their clients, max_read_buffer_bytes): retry later"), 0)
                return
            out = pb.ReadResults(status=pb.OK, lac=lac)
            answer: pb.ReadResults | bytes = out
            bodies: list = []
            size = 0
            start = eid
            try:
                while eid <= last and size < batch_bytes and len(bodies) < READ_BATCH_ENTRIES:
                    chunk = await bookie.read_bodies(ledger, eid, last, batch_bytes - size,
                                                     READ_BATCH_ENTRIES - len(bodies), step, checked)
                    if not chunk:
                        m.read_errors.labels("NO_ENTRY").inc()
                        out.status = pb.NO_ENTRY
                        out.missing_entry = eid
                        out.message = f"entry {ledger}:{eid} is not stored on this bookie"
                        break
                    bodies.extend(chunk)
                    size += sum(map(len, chunk))
                    eid += len(chunk) * step
                if packed:
                    if bodies:
                        out.first_body_entry = start
                        answer = wire.encode_packed(out, bodies)
                else:
                    add = out.entries.add
                    for i, body in enumerate(bodies):
                        add(entry_id=start + i * step, body=bytes(body))
            except BaseException:
                buffer.release(batch_bytes)
                raise
            m.reads.inc(len(bodies))
            m.read_bytes.inc(size)
            await buffer.send(context, answer, batch_bytes)
            if out.status != pb.OK or eid > last:
                return
            lac = bookie.lac(ledger)

    async def ReadLac(self, request, context):
        await self._authorize(context, Operation.READ)
        lac = self.bookie.lac(request.ledger_id)
        if lac is None:
            return pb.ReadLacResponse(status=pb.NO_LEDGER, message=_why(pb.NO_LEDGER, request.ledger_id), lac=-1)
        body = b""
        if lac >= 0:
            try:
                body = bytes(self.bookie.read_entry(request.ledger_id, lac) or b"")
            except BookieStorageError:
                body = b""
        return pb.ReadLacResponse(status=pb.OK, lac=lac, last_entry_body=body)

    async def WriteLac(self, request, context):
        await self._authorize(context, Operation.WRITE_LAC)
        if self.bookie.has_ledger(request.ledger_id):  # else NO_LEDGER: WriteLac records no ledger
            status, why = await self._admit(request.ledger_id, request.master_key)
            if status != pb.OK:
                return pb.WriteLacResponse(status=status, message=why)
        try:
            status, why = await self.bookie.write_lac(request.ledger_id, request.lac, request.master_key)
        except OSError as exc:
            return pb.WriteLacResponse(status=pb.IO_ERROR, message=str(exc))
        return pb.WriteLacResponse(status=status, message=why)

    async def Info(self, request, context):
        principal = await self._authorize(context, Operation.INFO)
        free, total = self.bookie.disk_space()
        return pb.InfoResponse(bookie_id=self.bookie_id, read_only=self.bookie.read_only, free_bytes=free,
                               total_bytes=total, version=self.version, zone=self.zone,
                               ledger_count=len(self.bookie.ledgers), caller=principal.name,
                               caller_role=str(principal.role))

    async def ListEntries(self, request, context):
        await self._authorize(context, Operation.LIST)
        if not self.bookie.has_ledger(request.ledger_id):
            return pb.ListEntriesResponse(status=pb.NO_LEDGER, message=_why(pb.NO_LEDGER, request.ledger_id))
        ranges = self.bookie.list_entries(request.ledger_id)
        return pb.ListEntriesResponse(status=pb.OK, ranges=[pb.EntryRange(first=a, last=b) for a, b in ranges])

    async def ListLedgers(self, request, context):
        await self._authorize(context, Operation.LIST)
        return pb.ListLedgersResponse(ledger_ids=sorted(self.bookie.ledgers))


def _why(status: int, ledger: int) -> str:
    return {pb.NO_LEDGER: f"ledger {ledger} is not stored on this bookie",
            pb.UNAUTHORIZED: f"wrong master key for ledger {ledger}",
            pb.BAD_REQUEST: "master key missing",
            pb.FENCED: f"ledger {ledger} is fenced"}.get(status, pb.Status.Name(status))


class Undecodable:
    """What a request that is not a valid protobuf of its type deserializes to: the handler then
    answers INVALID_ARGUMENT, instead of gRPC's UNKNOWN (unary) or a silent end (Add stream)."""

    def __init__(self, method: str, reason: str):
        self.message = f"undecodable {method} request: {reason}"


def _lenient(method: str, parse, sized: bool = False):
    """A deserializer (by `parse`: a message type's FromString, or wire.read_add_batch) that answers
    Undecodable instead of raising; with sized, it gives (message, its size on the wire)."""
    def deserialize(data: bytes):
        try:
            message = parse(data)
        except DecodeError as exc:
            return Undecodable(method, str(exc))
        return (message, len(data)) if sized else message
    return deserialize


def _failed_code(context, exc: BaseException) -> str:
    """The gRPC status code name a call that raised `exc` ends with: what context.abort set,
    CANCELLED when the caller went away (or its deadline passed), else UNKNOWN (an unexpected error)."""
    if isinstance(exc, asyncio.CancelledError):
        return grpc.StatusCode.CANCELLED.name
    code = context.code()
    return code.name if isinstance(code, grpc.StatusCode) else grpc.StatusCode.UNKNOWN.name


def _checked(name: str, behavior, client_streaming: bool, errors: Counter):
    """Wrap one servicer method so that an Undecodable request ends the call with INVALID_ARGUMENT,
    and a call that ends with an error is counted in `errors` by method and code (the one place
    every RPC passes; free while nothing fails). On the Add stream the good batches before it are
    still answered. Server-streaming methods write their answers with context.write, so they wrap
    like unary ones."""
    if client_streaming:
        async def add(request_iterator, context):
            bad: list[Undecodable] = []

            async def decoded():
                async for request in request_iterator:
                    if isinstance(request, Undecodable):
                        bad.append(request)
                        return
                    yield request
            try:
                await behavior(decoded(), context)
                if bad:
                    log.warning("%s from %s: %s", name, context.peer(), bad[0].message)
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, bad[0].message)
            except BaseException as exc:
                errors.labels(name, _failed_code(context, exc)).inc()
                raise
        return add

    async def unary(request, context):
        try:
            if isinstance(request, Undecodable):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
            return await behavior(request, context)
        except BaseException as exc:
            errors.labels(name, _failed_code(context, exc)).inc()
            raise
    return unary


def _methods(service: BookieService) -> list[Method]:
    """The `pybk.Bookie` methods of bookie.proto bound to the service, with lenient decoding."""
    methods = []
    for m in pb.DESCRIPTOR.services_by_name["Bookie"].methods:
        request_type, response_type = getattr(pb, m.input_type.name), getattr(pb, m.output_type.name)
        kind = Kind.BIDI if m.client_streaming else Kind.SERVER_STREAM if m.server_streaming else Kind.UNARY
        # an Add batch's bodies stay in the bytes received (wire.read_add_batch): no copy of them
        parse = wire.read_add_batch if m.name == "Add" else request_type.FromString
        methods.append(Method(f"/pybk.Bookie/{m.name}", kind, _lenient(m.name, parse, m.client_streaming),
                              wire.serializer(response_type),
                              _checked(m.name, getattr(service, m.name), m.client_streaming,
                                       service.bookie.metrics.grpc_errors)))
    return methods


def make_server(service: BookieService, sock: socket.socket, tls: ssl.SSLContext | None = None,
                connections: ConnectionLimits = ConnectionLimits()) -> Server:
    """The bookie's gRPC server on a listening socket, over TLS with `tls` (an SSLContext
    offering ALPN h2, certificates following their files), holding connections to `connections`
    (counted in the bookie's metrics) and what it holds for clients to the service's
    max_client_memory. A message bigger than the service's max_message_size ends its call
    RESOURCE_EXHAUSTED."""
    m = service.bookie.metrics
    server = Server(_methods(service), sock, service.limits.max_message_size, tls, connections,
                    on_refused=lambda reason: m.connections_refused.labels(reason).inc(),
                    on_closed=lambda reason: m.connections_closed.labels(reason).inc(),
                    budget_bytes=service.limits.max_client_memory, identify=service.identifies)
    m.connections.set_function(lambda: server.connections)
    m.connection_limit.set(connections.max_connections)
    return server
