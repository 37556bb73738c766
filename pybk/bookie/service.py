"""The gRPC service `pybk.Bookie`: translates batched requests into storage calls.

Every handler answers bad input with a status (BAD_REQUEST, NO_LEDGER, ...) and never lets one
client's request take the server down.
"""
from __future__ import annotations

import asyncio
import logging

import grpc
from google.protobuf.message import DecodeError

from pybk.proto import pb, rpc

from .bookie import Bookie, BookieStorageError

log = logging.getLogger("pybk.bookie.service")

READ_BATCH_BYTES = 1024 * 1024
READ_BATCH_ENTRIES = 4096
MAX_LONG_POLL_MS = 60_000
MAX_READ_STEP = 1 << 16  # strides beyond any sane ensemble size are refused
# Clients ping every 10 s, also between calls, to notice a dead bookie quickly; the server must
# permit that, or gRPC's default (one ping per 5 min without data) answers GOAWAY too_many_pings.
GRPC_OPTIONS = [("grpc.max_receive_message_length", 256 * 1024 * 1024),
                ("grpc.max_send_message_length", 256 * 1024 * 1024),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
                ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
                # gRPC sets SO_REUSEPORT by default: a second bookie configured with the same port
                # would then start fine and silently get part of the first one's connections.
                ("grpc.so_reuseport", 0)]


class BookieService(rpc.BookieServicer):
    """Servicer over one storage core."""

    def __init__(self, bookie: Bookie, bookie_id: str, zone: str = "", version: str = ""):
        self.bookie = bookie
        self.bookie_id = bookie_id
        self.zone = zone
        self.version = version

    async def Add(self, request_iterator, context):
        """Each incoming batch is journaled as it arrives (batches overlap); results go back as
        each batch becomes durable, one AddResults per AddBatch."""
        bookie = self.bookie
        done: asyncio.Queue = asyncio.Queue()
        state = {"outstanding": 0, "eof": False}

        def finish(batch, results, fut):
            error = None
            if fut is not None:
                exc = fut.exception() if not fut.cancelled() else OSError("bookie shutting down")
                if exc is not None:
                    error = f"journal write failed: {exc}"
            done.put_nowait(_add_results(batch, results, error, bookie.metrics))

        async def reader():
            try:
                async for batch in request_iterator:
                    state["outstanding"] += 1
                    bookie.metrics.add_batch_size.observe(len(batch.entries))
                    try:
                        results, fut = bookie.add_batch(batch.entries)
                    except Exception as exc:  # noqa: BLE001 - answer, do not crash
                        log.exception("add batch failed")
                        results = [(i, pb.IO_ERROR, str(exc)) for i in range(len(batch.entries))]
                        fut = None
                    if fut is None:
                        finish(batch, results, None)
                    else:
                        fut.add_done_callback(lambda f, b=batch, r=results: finish(b, r, f))
            finally:
                state["eof"] = True
                done.put_nowait(None)

        task = asyncio.get_running_loop().create_task(reader())
        try:
            while True:
                item = await done.get()
                if item is None:
                    if state["outstanding"] == 0:
                        break
                    continue
                state["outstanding"] -= 1
                await context.write(item)
                if state["eof"] and state["outstanding"] == 0:
                    break
        finally:
            task.cancel()

    async def Read(self, request, context):
        bookie = self.bookie
        ledger, first, last = request.ledger_id, request.first_entry, request.last_entry
        m = bookie.metrics
        try:
            if request.flags & pb.FENCE:
                status, lac = await bookie.fence(ledger, request.master_key)
                if status != pb.OK:
                    m.read_errors.labels(pb.Status.Name(status)).inc()
                    yield pb.ReadResults(status=status, message=_why(status, ledger), lac=-1)
                    return
                if first < 0:
                    yield pb.ReadResults(status=pb.OK, lac=lac)
                    return
            if first < 0:
                if request.flags & pb.LONG_POLL:
                    timeout = min(request.timeout_ms or 10_000, MAX_LONG_POLL_MS) / 1000
                    lac = await bookie.wait_lac(ledger, request.previous_lac, timeout)
                else:
                    lac = bookie.lac(ledger)
                if lac is None:
                    yield pb.ReadResults(status=pb.NO_LEDGER, message=_why(pb.NO_LEDGER, ledger), lac=-1)
                else:
                    yield pb.ReadResults(status=pb.OK, lac=lac)
                return
            if last < first:
                yield pb.ReadResults(status=pb.BAD_REQUEST, lac=-1,
                                     message=f"bad range [{first}, {last}]: last must be >= first >= 0")
                return
            step = request.step or 1
            if step > MAX_READ_STEP:
                m.read_errors.labels("BAD_REQUEST").inc()
                yield pb.ReadResults(status=pb.BAD_REQUEST, lac=-1,
                                     message=f"bad step {step}: must be 0 or 1 (every entry) up to {MAX_READ_STEP}")
                return
            m.read_requests.inc()
            lac = bookie.lac(ledger)
            if lac is None:
                m.read_errors.labels("NO_LEDGER").inc()
                yield pb.ReadResults(status=pb.NO_LEDGER, message=_why(pb.NO_LEDGER, ledger), lac=-1)
                return
            out = pb.ReadResults(status=pb.OK, lac=lac)
            size = count = 0
            eid = first
            while eid <= last:
                chunk = await bookie.read_chunk(ledger, eid, last, READ_BATCH_BYTES - size,
                                                READ_BATCH_ENTRIES - count, step)
                if not chunk:
                    m.read_errors.labels("NO_ENTRY").inc()
                    out.status = pb.NO_ENTRY
                    out.missing_entry = eid
                    out.message = f"entry {ledger}:{eid} is not stored on this bookie"
                    break
                add = out.entries.add
                for e, body in chunk:
                    add(entry_id=e, body=body)
                    size += len(body)
                count += len(chunk)
                eid += len(chunk) * step
                if size >= READ_BATCH_BYTES or count >= READ_BATCH_ENTRIES:
                    m.reads.inc(count)
                    m.read_bytes.inc(size)
                    yield out
                    out = pb.ReadResults(status=pb.OK, lac=bookie.lac(ledger))
                    size = count = 0
            if count or out.status != pb.OK or eid == first:
                m.reads.inc(count)
                m.read_bytes.inc(size)
                yield out
        except (BookieStorageError, OSError) as exc:
            log.error("read %d:[%d,%d] failed: %s", ledger, first, last, exc)
            yield pb.ReadResults(status=pb.IO_ERROR, message=str(exc), lac=-1)

    async def ReadLac(self, request, context):
        lac = self.bookie.lac(request.ledger_id)
        if lac is None:
            return pb.ReadLacResponse(status=pb.NO_LEDGER, message=_why(pb.NO_LEDGER, request.ledger_id), lac=-1)
        body = b""
        if lac >= 0:
            try:
                body = self.bookie.read_entry(request.ledger_id, lac) or b""
            except BookieStorageError:
                body = b""
        return pb.ReadLacResponse(status=pb.OK, lac=lac, last_entry_body=body)

    async def WriteLac(self, request, context):
        try:
            status = await self.bookie.write_lac(request.ledger_id, request.lac, request.master_key)
        except OSError as exc:
            return pb.WriteLacResponse(status=pb.IO_ERROR, message=str(exc))
        return pb.WriteLacResponse(status=status, message="" if status == pb.OK else _why(status, request.ledger_id))

    async def Info(self, request, context):
        free, total = self.bookie.disk_space()
        return pb.InfoResponse(bookie_id=self.bookie_id, read_only=self.bookie.read_only, free_bytes=free,
                               total_bytes=total, version=self.version, zone=self.zone,
                               ledger_count=len(self.bookie.ledgers))

    async def ListEntries(self, request, context):
        if not self.bookie.has_ledger(request.ledger_id):
            return pb.ListEntriesResponse(status=pb.NO_LEDGER, message=_why(pb.NO_LEDGER, request.ledger_id))
        ranges = self.bookie.list_entries(request.ledger_id)
        return pb.ListEntriesResponse(status=pb.OK, ranges=[pb.EntryRange(first=a, last=b) for a, b in ranges])

    async def ListLedgers(self, request, context):
        return pb.ListLedgersResponse(ledger_ids=sorted(self.bookie.ledgers))


def _add_results(batch, errors: list[tuple[int, int, str]], error: str | None, metrics) -> pb.AddResults:
    """One result per entry, in the batch's order. OK results carry only the request id (the
    client matches on it); refusals also carry ledger, entry and a message."""
    out = pb.AddResults()
    add = out.results.add
    entries = batch.entries
    if not errors and error is None:
        for e in entries:
            add(request_id=e.request_id)
        return out
    refused = {i: (status, message) for i, status, message in errors}
    for i, e in enumerate(entries):
        status, message = refused.get(i, (pb.OK, ""))
        if status == pb.OK and error is not None:
            status, message = pb.IO_ERROR, error
        if status == pb.OK:
            add(request_id=e.request_id)
        else:
            metrics.add_errors.labels(pb.Status.Name(status)).inc()
            add(request_id=e.request_id, ledger_id=e.ledger_id, entry_id=e.entry_id, status=status,
                message=message)
    return out


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


def _lenient(method: str, message_type):
    def deserialize(data: bytes):
        try:
            return message_type.FromString(data)
        except DecodeError as exc:
            return Undecodable(method, str(exc))
    return deserialize


def _checked(name: str, behavior, client_streaming: bool, server_streaming: bool):
    """Wrap one servicer method so that an Undecodable request ends the call with INVALID_ARGUMENT.
    On the Add stream the good batches before it are still answered."""
    if client_streaming:
        async def add(request_iterator, context):
            bad: list[Undecodable] = []

            async def decoded():
                async for request in request_iterator:
                    if isinstance(request, Undecodable):
                        bad.append(request)
                        return
                    yield request
            await behavior(decoded(), context)
            if bad:
                log.warning("%s from %s: %s", name, context.peer(), bad[0].message)
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, bad[0].message)
        return add
    if server_streaming:
        async def stream(request, context):
            if isinstance(request, Undecodable):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
            async for response in behavior(request, context):
                yield response
        return stream
    async def unary(request, context):
        if isinstance(request, Undecodable):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
        return await behavior(request, context)
    return unary


def _method_handlers(service: BookieService) -> grpc.GenericRpcHandler:
    """The `pybk.Bookie` methods of bookie.proto bound to the service, with lenient decoding."""
    handlers = {}
    for m in pb.DESCRIPTOR.services_by_name["Bookie"].methods:
        request_type, response_type = getattr(pb, m.input_type.name), getattr(pb, m.output_type.name)
        make = {(True, True): grpc.stream_stream_rpc_method_handler,
                (False, True): grpc.unary_stream_rpc_method_handler,
                (False, False): grpc.unary_unary_rpc_method_handler}[(m.client_streaming, m.server_streaming)]
        handlers[m.name] = make(_checked(m.name, getattr(service, m.name), m.client_streaming, m.server_streaming),
                                request_deserializer=_lenient(m.name, request_type),
                                response_serializer=response_type.SerializeToString)
    return grpc.method_handlers_generic_handler("pybk.Bookie", handlers)


def make_server(service: BookieService, address: str) -> grpc.aio.Server:
    """A grpc.aio server with the service bound to address (host:port)."""
    server = grpc.aio.server(options=GRPC_OPTIONS)
    server.add_generic_rpc_handlers((_method_handlers(service),))
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as exc:  # grpc raises "Failed to bind to address" when the port is taken
        raise OSError(f"cannot listen for gRPC on {address}: the port is in use or the address is not "
                      f"this host's ({exc})") from None
    if bound == 0:
        raise OSError(f"cannot listen for gRPC on {address}")
    return server
