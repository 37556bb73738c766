"""The gRPC service `pybk.Bookie`: translates batched requests into storage calls.

Every handler answers bad input with a status (BAD_REQUEST, NO_LEDGER, ...) and never lets one
client's request take the server down.
"""
from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from dataclasses import dataclass, replace
from itertools import accumulate, chain
from time import monotonic

import grpc
from google.protobuf.message import DecodeError
from prometheus_client import Counter

from pybk import __version__
from pybk.config import option_field
from pybk.entry import HEADER_SIZE
from pybk.proto import pb, rpc, wire
from pybk.proto.wire import ADD_RUNS_HEADER, MESSAGE_HEADROOM
from pybk.security.auth import AccessDenied, Authenticator, Denial
from pybk.security.roles import OPEN, Operation, Principal
from pybk.transport.grpc_server import ConnectionLimits, Kind, Method, Server, Throttled

from .bookie import AddRun, Bookie, BookieStorageError, runs_of
from .keys import KeyGate
from .state import KEY_MISSING, LOOKUP, needs_admission

log = logging.getLogger("pybk.bookie.service")
# refused calls and cancelled Read streams are as many as a client likes: a line per kind a minute
noted = Throttled(logger=log)

READ_BATCH_BYTES = 1024 * 1024        # bodies per read answer of ReadEntry messages
PACKED_BATCH_BYTES = 3 * 1024 * 1024  # bodies per PACKED answer (at most a third of max_message_size): 1 -> 4
                                      # MiB cut the bookies' CPU per entry read by ~20% (fewer gRPC writes)
READ_BATCH_ENTRIES = 4096
MAX_LONG_POLL_MS = 60_000
MAX_READ_STEP = 1 << 16  # strides beyond any sane ensemble size are refused


@dataclass(frozen=True)
class Limits:
    """What one client may hold of a bookie's memory (the bookie's options of the same names).
    A max_message_size of 0 is the largest entry plus headroom (`message_limit`)."""

    max_message_size: int = option_field("max_message_size")
    max_add_bytes_in_flight: int = option_field("max_add_bytes_in_flight")
    max_add_bytes_in_flight_per_connection: int = option_field("max_add_bytes_in_flight_per_connection")
    max_read_buffer_bytes: int = option_field("max_read_buffer_bytes")
    max_client_memory: int = option_field("max_client_memory")
    read_stream_timeout: float = option_field("read_stream_timeout")


def message_limit(max_message_size: int, max_entry_size: int) -> int:
    """The largest gRPC message: as configured, or (0) the largest entry plus headroom."""
    return max_message_size or max_entry_size + MESSAGE_HEADROOM


class ReadBuffer:
    """Read answers handed to gRPC and not yet taken by their clients, over all Read streams.

    An answer is built only once the previous one of its stream was taken, so a stream whose
    client stops reading holds one answer. Room for it is reserved here first: when the answers
    held would pass the byte limit a new one waits, and if the oldest held one has waited longer
    than STUCK_SECONDS its stream is cancelled at once, so stuck readers cannot keep live ones
    waiting; a stream whose client takes nothing for `timeout` seconds is cancelled anyway. A
    cancelled stream is reset (trailers CANCELLED, RST_STREAM), and its queued answer dropped.
    Streams waiting for room wait in line: only the first is woken when room is freed, and only
    it looks for a stuck stream (woken all at once, 2,000 waiting streams each scanned all the
    others at every answer taken, and stalled the event loop half a second)."""

    STUCK_SECONDS = 1.0

    def __init__(self, limit: int, timeout: float):
        self.limit = limit
        self.timeout = timeout
        self.used = 0
        self._writers: dict[asyncio.Task, float] = {}  # stream task -> when its write began
        self._evicted: dict[asyncio.Task, tuple[str, str]] = {}  # stream task -> (kind, why) it is cancelled
        self._freed = asyncio.Event()
        self._line = asyncio.Lock()  # the streams waiting for room, first come first served
        self._sweeper: asyncio.Task | None = None

    async def reserve(self, nbytes: int) -> bool:
        """Room for an answer of up to nbytes, taken before the answer is built; False if none
        was found within the timeout (the caller answers TOO_MANY_REQUESTS). `send` gives it back."""
        if self.used and self.used + nbytes > self.limit and not await self._room(nbytes):
            return False
        self.used += nbytes
        return True

    async def send(self, context, message, nbytes: int) -> None:
        """Write an answer into the room reserved for it (nbytes, also 0: none); the call is
        cancelled when its client takes no answer in time, or is stuck while room is short.
        No timer per write: a sweeper looks at the writes in progress (cheap for short reads)."""
        task = asyncio.current_task()
        self._writers[task] = asyncio.get_running_loop().time()
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep(), name="read-sweeper")
        try:
            await context.write(message)
        except asyncio.CancelledError:
            evicted = self._evicted.get(task)
            if evicted:
                kind, why = evicted
                noted.warn(kind, f"{context.peer()} {why}: cancelling its stream")
            raise
        finally:
            del self._writers[task]
            self._evicted.pop(task, None)
            self.release(nbytes)

    def release(self, nbytes: int) -> None:
        """Give back room reserved for an answer that is not sent."""
        self.used -= nbytes
        self._freed.set()

    def _evict(self, task: asyncio.Task, kind: str, why: str) -> None:
        self._evicted[task] = kind, why
        task.cancel()

    async def _sweep(self) -> None:
        """Cancel the streams whose client took no answer for `timeout` seconds; ends when no
        write is in progress (send starts it again)."""
        loop = asyncio.get_running_loop()
        try:
            while self._writers:
                await asyncio.sleep(min(self.STUCK_SECONDS, self.timeout / 2))
                now = loop.time()
                for task, since in list(self._writers.items()):
                    if now - since >= self.timeout and task not in self._evicted:
                        self._evict(task, "read-timeout", f"took no answer for {self.timeout:g}s (read_stream_timeout)")
        finally:
            self._sweeper = None

    async def _room(self, nbytes: int) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        try:
            async with asyncio.timeout(self.timeout):
                await self._line.acquire()
        except TimeoutError:
            return False
        try:
            return await self._first_in_line(nbytes, deadline)
        finally:
            self._line.release()

    async def _first_in_line(self, nbytes: int, deadline: float) -> bool:
        loop = asyncio.get_running_loop()
        while self.used and self.used + nbytes > self.limit:
            now = loop.time()
            if now >= deadline:
                return False
            stuck = [(since, t) for t, since in self._writers.items()
                     if now - since >= self.STUCK_SECONDS and t not in self._evicted]
            if stuck:
                self._evict(min(stuck, key=lambda st: st[0])[1], "read-stuck",
                            f"took no answer while the read buffer ({self.limit} bytes, max_read_buffer_bytes) "
                            f"was full")
            self._freed.clear()
            try:
                async with asyncio.timeout(min(self.STUCK_SECONDS, deadline - now)):
                    await self._freed.wait()
            except TimeoutError:
                pass
        return True


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
        self.add_bytes_in_flight = 0
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

    async def _add_checked(self, runs: list[AddRun], errors: list[tuple[int, int, str]], fut, keyless: bool):
        """Add again the entries add_runs answered LOOKUP, once the metadata of their ledgers is
        read; returns the batch's merged (errors, future)."""
        pending = [i for i, status, _ in errors if status == LOOKUP]
        again_runs = _select(runs, pending)
        found = await self.keys.lookup(r.ledger_id for r in again_runs)
        again, fut2 = self.bookie.add_runs(again_runs, keyless, self.keys.admit_from(found))
        merged = [err for err in errors if err[1] != LOOKUP] + [(pending[j], s, m) for j, s, m in again]
        merged.sort()
        if fut is None or fut2 is None:
            return merged, fut if fut2 is None else fut2
        return merged, asyncio.gather(fut, fut2)

    async def _admit(self, ledger: int, key: bytes) -> tuple[int, str]:
        """(OK, "") or why not, for a fence or WriteLac whose key this bookie would record first."""
        if self.keys is None or not needs_admission(self.bookie.ledgers.get(ledger), key):
            return pb.OK, ""
        return await self.keys.check(ledger, key)

    async def Add(self, request_iterator, context):
        """Each incoming batch is journaled as it arrives (batches overlap); results go back as
        each batch becomes durable, one AddResults per AddBatch. The request iterator yields
        (batch, its size on the wire). A batch carries AddEntry messages, packed runs (announced
        to clients by the initial metadata ADD_RUNS_HEADER), or both; a malformed run is answered
        BAD_REQUEST whole and nothing of it is stored. A batch that would take the bytes in flight
        (received, not yet durable) of this stream or of the bookie past their caps is answered
        TOO_MANY_REQUESTS at once; one batch alone always passes. An allowed caller is authorized
        once, at stream start; a refused one gets every entry answered ACCESS_DENIED and is
        looked at again with each batch (the auth file may have changed). Ending the stream
        instead would race with the client's sending and reach it as INTERNAL."""
        await context.send_initial_metadata(((ADD_RUNS_HEADER, "1"),))
        principal, denied = self._authorize_stream(context, Operation.ADD)
        bookie = self.bookie
        limits = self.limits
        conn_cap, total_cap = limits.max_add_bytes_in_flight_per_connection, limits.max_add_bytes_in_flight
        done: asyncio.Queue = asyncio.Queue()
        state = {"outstanding": 0, "eof": False, "bytes": 0}
        keyless = principal is not None and principal.may(Operation.KEYLESS_RECOVERY)
        keys = self.keys
        admit = keys.admit if keys is not None else None

        def release(nbytes: int) -> None:
            state["bytes"] -= nbytes
            self.add_bytes_in_flight -= nbytes

        def finish(batch, layout, results, fut, nbytes, received):
            release(nbytes)
            bookie.metrics.add_latency.observe(monotonic() - received)
            error = None
            if fut is not None:
                exc = fut.exception() if not fut.cancelled() else OSError("bookie shutting down")
                if exc is not None:
                    error = f"journal write failed: {exc}"
            done.put_nowait(_add_results(batch, layout, results, error, bookie.metrics))

        async def reader():
            nonlocal principal, denied, keyless
            try:
                async for batch, nbytes in request_iterator:
                    received = monotonic()
                    state["outstanding"] += 1
                    if denied:
                        principal, denied = self._authorize_stream(context, Operation.ADD)
                        keyless = principal is not None and principal.may(Operation.KEYLESS_RECOVERY)
                    if denied:
                        done.put_nowait(_refuse_all(batch, pb.ACCESS_DENIED, denied, bookie.metrics))
                        continue
                    runs, layout = _unpack(batch)
                    n = layout[-1]
                    bookie.metrics.add_batch_size.observe(n)
                    refusal = _over_cap(state["bytes"], nbytes, conn_cap, "on this connection",
                                        "max_add_bytes_in_flight_per_connection") or \
                        _over_cap(self.add_bytes_in_flight, nbytes, total_cap, "on this bookie",
                                  "max_add_bytes_in_flight")
                    if refusal:
                        done.put_nowait(_refuse_all(batch, pb.TOO_MANY_REQUESTS, refusal, bookie.metrics))
                        continue
                    state["bytes"] += nbytes
                    self.add_bytes_in_flight += nbytes
                    try:
                        results, fut = bookie.add_runs(runs, keyless, admit)
                        if results and keys is not None and any(r[1] == LOOKUP for r in results):
                            results, fut = await self._add_checked(runs, results, fut, keyless)
                    except Exception as exc:  # noqa: BLE001 - answer, do not crash
                        log.exception("add batch from %s failed", principal.name)
                        results = [(i, pb.IO_ERROR, str(exc)) for i in range(n)]
                        fut = None
                    if fut is None:
                        finish(batch, layout, results, None, nbytes, received)
                    else:
                        fut.add_done_callback(lambda f, b=batch, lo=layout, r=results, nb=nbytes, t=received:
                                              finish(b, lo, r, f, nb, t))
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
                if request.flags & pb.LONG_POLL:
                    timeout = min(request.timeout_ms or 10_000, MAX_LONG_POLL_MS) / 1000
                    lac = await bookie.wait_lac(ledger, request.previous_lac, timeout)
                else:
                    lac = bookie.lac(ledger)
                if lac is None:
                    await context.write(pb.ReadResults(status=pb.NO_LEDGER, message=_why(pb.NO_LEDGER, ledger),
                                                       lac=-1))
                else:
                    await context.write(pb.ReadResults(status=pb.OK, lac=lac))
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
                body = self.bookie.read_entry(request.ledger_id, lac) or b""
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


def _unpack(batch: pb.AddBatch) -> tuple[list[AddRun], list]:
    """The runs add_runs takes for a batch: its AddEntry messages (grouped), then its packed
    runs, and the layout _add_results answers by: [its AddEntry count, then per packed run its
    first index among the runs' entries or the reason it is malformed, ..., the entry count]."""
    runs = runs_of(batch.entries)
    n = len(batch.entries)
    layout: list = [n]
    for r in batch.runs:
        ids, sizes, buf = list(r.entry_ids), list(r.body_sizes), r.bodies
        why = _malformed(r.ledger_id, ids, sizes, len(buf))
        if why:
            layout.append(why)
            continue
        ends = list(accumulate(sizes))
        runs.append(AddRun(r.ledger_id, r.master_key, r.flags, ids,
                           [buf[a:b] for a, b in zip(chain((0,), ends), ends)], buf))
        layout.append(n)
        n += len(ids)
    layout.append(n)
    return runs, layout


def _malformed(ledger: int, ids: list[int], sizes: list[int], nbytes: int) -> str:
    """Why a packed run (of `ledger`, its entry ids, body sizes and bodies' length) cannot be
    taken apart into entries ("" if it can). Its entries are then checked one by one like
    AddEntry messages; a size below an entry header is refused here, so that a run's answer (a
    few bytes per refused entry) stays smaller than the run."""
    if not ids or len(ids) != len(sizes):
        return (f"malformed run of ledger {ledger}: {len(ids)} entry ids and {len(sizes)} body sizes "
                f"(need the same number, at least one)")
    total = sum(sizes)
    if total != nbytes:
        return f"malformed run of ledger {ledger}: body sizes sum to {total} bytes, the bodies are {nbytes} bytes"
    small = min(sizes)
    if small < HEADER_SIZE:
        return (f"malformed run of ledger {ledger}: an entry body of {small} bytes, shorter than an "
                f"entry header ({HEADER_SIZE} bytes)")
    return ""


def _refuse_all(batch: pb.AddBatch, status: int, message: str, metrics) -> pb.AddResults:
    """Every entry of the batch refused with one status (access denied, over a cap)."""
    out = pb.AddResults()
    add = out.results.add
    for e in batch.entries:
        add(request_id=e.request_id, ledger_id=e.ledger_id, entry_id=e.entry_id, status=status, message=message)
    add_run = out.runs.add
    n = len(batch.entries)
    for r in batch.runs:
        add_run(request_id=r.request_id, status=status, message=message)
        n += len(r.entry_ids)
    if n:
        metrics.add_errors.labels(pb.Status.Name(status)).inc(n)
    return out


def _add_results(batch, layout: list, errors: list[tuple[int, int, str]], error: str | None,
                 metrics) -> pb.AddResults:
    """The answer to a batch: one result per AddEntry, in order (OK ones carry only the request
    id, the client matches on it; refusals also carry ledger, entry and a message), and one per
    packed run: its status (OK, or IO_ERROR with `error`, the journal's failure) and the
    entries refused otherwise (errors: (index, status, message) in index order)."""
    out = pb.AddResults()
    add = out.results.add
    entries = batch.entries
    if not errors and error is None and str not in map(type, layout):
        for e in entries:
            add(request_id=e.request_id)
        add_run = out.runs.add
        for r in batch.runs:
            add_run(request_id=r.request_id)
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
    base, base_message = (pb.IO_ERROR, error) if error is not None else (pb.OK, "")
    for r, first in zip(batch.runs, layout[1:]):
        res = out.runs.add(request_id=r.request_id)
        if type(first) is str:
            res.status, res.message = pb.BAD_REQUEST, first
            metrics.add_errors.labels("BAD_REQUEST").inc(len(r.entry_ids))
            continue
        ids = r.entry_ids
        fails = [(k, refused[first + k]) for k in range(len(ids)) if first + k in refused]
        if base != pb.OK:
            metrics.add_errors.labels(pb.Status.Name(base)).inc(len(ids) - len(fails))
        if fails and len(fails) == len(ids) and all(f[1][0] == fails[0][1][0] for f in fails):
            res.status, res.message = fails[0][1]  # the whole run refused for one cause
            metrics.add_errors.labels(pb.Status.Name(res.status)).inc(len(ids))
            continue
        res.status, res.message = base, base_message
        told: set[int] = set()
        for k, (status, message) in fails:
            metrics.add_errors.labels(pb.Status.Name(status)).inc()
            res.failures.add(index=k, entry_id=ids[k], status=status,
                             message="" if status in told else message)
            told.add(status)
    return out


def _select(runs: list[AddRun], indices: list[int]) -> list[AddRun]:
    """The entries at `indices` (ascending, counting the runs' entries in order) as runs: one
    per run they come from, so that their order and so their indices match."""
    out: list[AddRun] = []
    it = iter(indices)
    want = next(it, None)
    first = 0
    for r in runs:
        end = first + len(r.entry_ids)
        ids: list[int] = []
        bodies: list[bytes] = []
        while want is not None and want < end:
            ids.append(r.entry_ids[want - first])
            bodies.append(r.bodies[want - first])
            want = next(it, None)
        if ids:
            out.append(AddRun(r.ledger_id, r.master_key, r.flags, ids, bodies))
        first = end
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


def _lenient(method: str, message_type, sized: bool = False):
    """A deserializer that answers Undecodable instead of raising; with sized, it gives
    (message, its size on the wire)."""
    def deserialize(data: bytes):
        try:
            message = message_type.FromString(data)
        except DecodeError as exc:
            return Undecodable(method, str(exc))
        return (message, len(data)) if sized else message
    return deserialize


def _over_cap(held: int, nbytes: int, cap: int, where: str, option: str) -> str:
    """Why a batch of nbytes may not join `held` bytes in flight (or "" if it may): beyond the
    cap, unless nothing is held (a single batch always passes)."""
    if held and held + nbytes > cap:
        return f"{held} bytes of adds in flight {where}, cap {cap} ({option}): resend later"
    return ""


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
        methods.append(Method(f"/pybk.Bookie/{m.name}", kind, _lenient(m.name, request_type, m.client_streaming),
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
