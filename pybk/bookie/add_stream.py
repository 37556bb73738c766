"""The Add stream of the gRPC service: batches in, each journaled as it arrives (batches
overlap), results out as each becomes durable, one AddResults per AddBatch; and the wire's
form of runs and results (`unpack`, `results`)."""
from __future__ import annotations

import asyncio
import logging
from itertools import accumulate, chain
from time import monotonic
from typing import AsyncIterator, Callable

from pybk.entry import HEADER_SIZE
from pybk.proto import pb
from pybk.proto.wire import ADD_RUNS_HEADER, AddBatchView
from pybk.security.roles import Operation, Principal

from .adds import AddRun, runs_of
from .bookie import Bookie
from .keys import KeyGate
from .limits import Limits
from .state import LOOKUP

log = logging.getLogger("pybk.bookie.service")


class InFlight:
    """Entry bytes of adds received and not yet answered, over all of a bookie's Add streams."""

    def __init__(self) -> None:
        self.bytes = 0


class AddStream:
    """One client's Add stream. The request iterator yields (batch, its size on the wire). A
    batch carries AddEntry messages, packed runs (announced to clients by the initial metadata
    ADD_RUNS_HEADER), or both; a malformed run is answered BAD_REQUEST whole and nothing of it
    is stored. A batch that would take the bytes in flight (received, not yet durable) of this
    stream or of the bookie past their caps is answered TOO_MANY_REQUESTS at once; one batch
    alone always passes. An allowed caller is authorized once, at stream start; a refused one
    gets every entry answered ACCESS_DENIED and is looked at again with each batch (the auth
    file may have changed). Ending the stream instead would race with the client's sending and
    reach it as INTERNAL."""

    def __init__(self, bookie: Bookie, keys: KeyGate | None, limits: Limits, in_flight: InFlight,
                 authorize: Callable[[], tuple[Principal | None, str]], context):
        self.bookie = bookie
        self.keys = keys      # first keys checked against the metadata (None: no metadata)
        self.limits = limits  # the caps on bytes in flight
        self.in_flight = in_flight
        self.authorize = authorize  # (Principal, "") or (None, why refused)
        self.context = context
        self.done: asyncio.Queue = asyncio.Queue()  # answers in the order batches became durable
        self.outstanding = 0  # batches received and not yet answered
        self.eof = False      # the client sent its last batch
        self.bytes = 0        # entry bytes of this stream in flight
        self._authorize()

    def _authorize(self) -> None:
        self.principal, self.denied = self.authorize()
        self.keyless = self.principal is not None and self.principal.may(Operation.KEYLESS_RECOVERY)

    async def run(self, request_iterator: AsyncIterator[tuple[AddBatchView, int]]) -> None:
        """Take batches and answer them until the client is done and every answer is sent."""
        await self.context.send_initial_metadata(((ADD_RUNS_HEADER, "1"),))
        task = asyncio.get_running_loop().create_task(self._read(request_iterator))
        try:
            while True:
                item = await self.done.get()
                if item is None:
                    if self.outstanding == 0:
                        break
                    continue
                self.outstanding -= 1
                await self.context.write(item)
                if self.eof and self.outstanding == 0:
                    break
        finally:
            task.cancel()

    async def _read(self, request_iterator: AsyncIterator[tuple[AddBatchView, int]]) -> None:
        try:
            async for batch, nbytes in request_iterator:
                self.outstanding += 1
                await self._take(batch, nbytes, monotonic())
        finally:
            self.eof = True
            self.done.put_nowait(None)

    async def _take(self, batch: AddBatchView, nbytes: int, received: float) -> None:
        """Refuse a batch, or add it and answer it once durable."""
        metrics = self.bookie.metrics
        if self.denied:
            self._authorize()
        if self.denied:
            self.done.put_nowait(_refuse_all(batch, pb.ACCESS_DENIED, self.denied, metrics))
            return
        runs, layout = unpack(batch)
        n = layout[-1]
        metrics.add_batch_size.observe(n)
        limits = self.limits
        refusal = _over_cap(self.bytes, nbytes, limits.max_add_bytes_in_flight_per_connection,
                            "on this connection", "max_add_bytes_in_flight_per_connection") or \
            _over_cap(self.in_flight.bytes, nbytes, limits.max_add_bytes_in_flight, "on this bookie",
                      "max_add_bytes_in_flight")
        if refusal:
            self.done.put_nowait(_refuse_all(batch, pb.TOO_MANY_REQUESTS, refusal, metrics))
            return
        self.bytes += nbytes
        self.in_flight.bytes += nbytes
        keys = self.keys
        try:
            errors, fut = self.bookie.add_runs(runs, self.keyless, keys.admit if keys is not None else None)
            if errors and keys is not None and any(r[1] == LOOKUP for r in errors):
                errors, fut = await self._add_checked(runs, errors, fut)
        except Exception as exc:  # noqa: BLE001 - answer, do not crash
            log.exception("add batch from %s failed", self.principal.name)
            errors = [(i, pb.IO_ERROR, str(exc)) for i in range(n)]
            fut = None
        if fut is None:
            self._finish(batch, layout, errors, None, nbytes, received)
        else:
            fut.add_done_callback(lambda f: self._finish(batch, layout, errors, f, nbytes, received))

    async def _add_checked(self, runs: list[AddRun], errors: list[tuple[int, int, str]], fut):
        """Add again the entries add_runs answered LOOKUP, once the metadata of their ledgers is
        read; returns the batch's merged (errors, future)."""
        keys = self.keys
        pending = [i for i, status, _ in errors if status == LOOKUP]
        again_runs = _select(runs, pending)
        found = await keys.lookup(r.ledger_id for r in again_runs)
        again, fut2 = self.bookie.add_runs(again_runs, self.keyless, keys.admit_from(found))
        merged = [err for err in errors if err[1] != LOOKUP] + [(pending[j], s, m) for j, s, m in again]
        merged.sort()
        if fut is None or fut2 is None:
            return merged, fut if fut2 is None else fut2
        return merged, asyncio.gather(fut, fut2)

    def _finish(self, batch, layout, errors, fut, nbytes: int, received: float) -> None:
        """A batch is durable (or its journal write failed): queue its answer, free its bytes."""
        self.bytes -= nbytes
        self.in_flight.bytes -= nbytes
        metrics = self.bookie.metrics
        metrics.add_latency.observe(monotonic() - received)
        error = None
        if fut is not None:
            exc = fut.exception() if not fut.cancelled() else OSError("bookie shutting down")
            if exc is not None:
                error = f"journal write failed: {exc}"
        self.done.put_nowait(results(batch, layout, errors, error, metrics))


def unpack(batch: "pb.AddBatch | AddBatchView") -> tuple[list[AddRun], list]:
    """The runs add_runs takes for a batch: its AddEntry messages (grouped), then its packed
    runs, and the layout `results` answers by: [its AddEntry count, then per packed run its
    first index among the runs' entries or the reason it is malformed, ..., the entry count].
    The entries of runs read by wire.read_add_batch are views of the bytes received."""
    runs = runs_of(batch.entries)
    n = len(batch.entries)
    layout: list = [n]
    bodies = batch.bodies if isinstance(batch, AddBatchView) else [r.bodies for r in batch.runs]
    for r, buf in zip(batch.runs, bodies):
        ids, sizes = list(r.entry_ids), list(r.body_sizes)
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


def _refuse_all(batch: "pb.AddBatch | AddBatchView", status: int, message: str, metrics) -> pb.AddResults:
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


def results(batch, layout: list, errors: list[tuple[int, int, str]], error: str | None,
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



def _over_cap(held: int, nbytes: int, cap: int, where: str, option: str) -> str:
    """Why a batch of nbytes may not join `held` bytes in flight (or "" if it may): beyond the
    cap, unless nothing is held (a single batch always passes)."""
    if held and held + nbytes > cap:
        return f"{held} bytes of adds in flight {where}, cap {cap} ({option}): resend later"
    return ""
