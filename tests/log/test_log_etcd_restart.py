"""etcd killed and restarted under a log's writer: every acknowledged record stays readable at its
offset, offsets stay dense, and the log takes a new writer afterwards."""
from __future__ import annotations

import asyncio
import time

import pytest
from polling import eventually

from pybk.client import BookKeeper
from pybk.log import LogConfig, LogError, Logs, Rollover, WriterOptions
from pybk.meta import MetadataUnavailableError
from pybk.meta.etcd import prefix_end
from pybk.meta.registry import RegistryState

PW = b"log-password"
OUTAGE = 3.0   # seconds etcd is down


def body(i: int) -> bytes:
    return b"record-%06d" % i


async def _write_until(logs: Logs, name: str, stop: asyncio.Event, acked: dict[int, bytes], errors: list) -> None:
    """Append 20 records at a time, pipelined, until `stop`; a writer that fails (a roll that could
    not reach etcd in time) is replaced once a new one can open. Records acknowledged go to `acked`."""
    i = 0
    while not stop.is_set():
        try:
            w = await logs.open_writer(name, password=PW, options=WriterOptions(batch_bytes=200))
        except (LogError, MetadataUnavailableError, OSError) as e:
            errors.append(e)
            await asyncio.sleep(0.2)
            continue
        try:
            while not stop.is_set():
                pending = [(i + k, w.append_nowait(body(i + k))) for k in range(20)]
                i += 20
                for n, p in pending:
                    await p
                    acked[p.offset] = body(n)
        except LogError as e:
            errors.append(e)
        finally:
            try:
                await w.close()
            except Exception as e:   # closing needs etcd: a writer that cannot is left for the next to fence
                errors.append(e)
                w.abandon()


@pytest.mark.private_etcd
async def test_every_acknowledged_record_survives_an_etcd_restart(bookies, etcd, metadata_uri):
    bookies(3, registration_ttl=2)
    async with await BookKeeper.connect(metadata_uri) as bk:
        logs = Logs(bk)
        await logs.create("orders", LogConfig(rollover=Rollover(max_records=100)), password=PW)
        acked: dict[int, bytes] = {}
        errors: list = []
        stop = asyncio.Event()
        writing = asyncio.ensure_future(_write_until(logs, "orders", stop, acked, errors))
        await eventually(lambda: len(acked) >= 300, timeout=60, what="records before the outage")
        old_leases = set((await _registrations(bk)).values())
        await asyncio.to_thread(etcd.kill)
        before_outage = len(acked)
        down_at = time.monotonic()
        await eventually(lambda: time.monotonic() - down_at >= OUTAGE, timeout=OUTAGE + 5, what="the outage")
        during = len(acked) - before_outage
        await asyncio.to_thread(etcd.start)
        await eventually(lambda: len(acked) >= before_outage + during + 300, timeout=120,
                         what="records acknowledged after etcd came back")
        stop.set()
        await asyncio.wait_for(writing, 120)

        async with await logs.open_reader("orders", end="latest") as r:
            recs = [rec async for rec in r]
        assert [x.offset for x in recs] == list(range(len(recs)))   # dense from 0
        stored = {x.offset: x.payload for x in recs}
        assert {o: stored.get(o) for o in acked} == acked       # each acknowledged record at its offset
        # the log takes a new writer, which continues after everything stored, once the three
        # bookies have registered again on new leases (their sessions declared the old ones lost; the
        # restarted etcd keeps the old registrations until those leases expire, so they do not count)
        async def registered_again() -> bool:
            found = await _registrations(bk)
            return len(found) == 3 and not old_leases & set(found.values())
        await eventually(registered_again, timeout=60, what="the three bookies registered on new leases")
        async with await logs.open_writer("orders", password=PW) as w:
            assert await w.append(b"after") == len(recs)


async def _registrations(bk: BookKeeper) -> dict[bytes, int]:
    """{writable registration key: the lease it hangs on}."""
    start = bk.store.registry.dir + RegistryState.WRITABLE.encode() + b"/"
    resp = await bk.store.etcd.range(start, prefix_end(start))
    return {kv.key: kv.lease for kv in resp.kvs}
