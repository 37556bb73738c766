"""A bookie's gRPC port holds a bounded number of connections, whatever clients do: in all and
per peer address (the excess closed as it is accepted, counted, logged once), a connection that
never speaks HTTP/2 is dropped after the handshake timeout, an idle one is closed with a GOAWAY
its clients reconnect from unawares, a silent one is pinged and dropped when nothing answers; and
the bookie's own files keep the descriptors they need. Real bookie processes on 127.0.0.1; other
loopback addresses (127.0.0.2, ...) stand for other client hosts."""
from __future__ import annotations

import asyncio
import os
import socket
import struct
import sys
from pathlib import Path

import grpc
import hpack
import pytest

from pybk import entry
from pybk.client.bookie_client import BookieClient, BookieError
from pybk.local.bookie import BookieProcess
from pybk.proto import pb, rpc
from pybk.transport.ngh2_client import split_address
import h2frames
from polling import eventually

KEY = entry.master_key(b"limits")
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]  # else gRPC shares the connection of a same channel


def body(ledger: int, eid: int) -> bytes:
    return entry.encode(ledger, eid, eid - 1, f"{ledger}:{eid}".encode() * 8)


def metric(bookie: BookieProcess, name: str) -> float:
    """One sample of the bookie's /metrics, by its full name with labels (0 if absent)."""
    status, page = bookie.http_get("/metrics")
    assert status == 200
    for line in page.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def metric_at_least(bookie: BookieProcess, name: str, value: float, timeout: float = 20) -> float:
    return await eventually(lambda: (v := metric(bookie, name)) >= value and v, timeout=timeout,
                            what=f"{name} >= {value}")


async def open_idle(address: str, count: int, source: str = "127.0.0.1", preface: bool = True) -> list[socket.socket]:
    """`count` connections from `source` that send the HTTP/2 preface and SETTINGS (or nothing)
    and then stay silent; the caller closes them. One the bookie reset at once (refused) is
    closed here already."""
    host, port = split_address(address)
    loop = asyncio.get_running_loop()
    socks = []
    for _ in range(count):
        s = socket.socket()
        s.setblocking(False)
        s.bind((source, 0))
        socks.append(s)
        try:
            await loop.sock_connect(s, (host, port))
            if preface:
                s.send(h2frames.PREFACE + h2frames.frame(h2frames.SETTINGS, 0, 0))
        except (ConnectionResetError, BrokenPipeError):
            s.close()
    return socks


def closed_by_peer(s: socket.socket) -> bool:
    """Whether the bookie ended this connection (EOF or a reset), reading what it sent."""
    if s.fileno() == -1:
        return True
    try:
        while True:
            if not s.recv(65536):
                return True
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


def close_all(socks: list[socket.socket]) -> None:
    for s in socks:
        s.close()


class LimitedBookie(BookieProcess):
    """A bookie whose open-files limit (soft and hard) is `open_files`, as a container's nofile."""

    def __init__(self, base_dir: Path, open_files: int, **options):
        self.open_files = open_files
        super().__init__(base_dir, **options)

    def _argv(self) -> list[str]:
        n = self.open_files
        wrapper = (f"import os, resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, ({n}, {n})); "
                   f"os.execv(sys.executable, [sys.executable, *sys.argv[1:]])")
        argv = super()._argv()
        return [sys.executable, "-c", wrapper, *argv[1:]]


def descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def test_a_flood_of_idle_connections_is_refused_beyond_the_limit_and_the_bookie_goes_on_writing(
        tmp_path, child_processes):
    """Open-files limit 1600 (soft and hard), 1024 descriptors reserved: the bookie holds at most
    576 gRPC connections. 2,000 idle connections from four hosts fill them and are refused beyond;
    a writer connected before keeps adding, checkpoints keep running (each opens files), no
    "Too many open files"; a new client is refused while the port is full and served once the
    flood is gone."""
    bookie = LimitedBookie(tmp_path / "bookie", open_files=1600, metadata_uri=None, checkpoint_interval=0.5,
                           idle_timeout=0)
    bookie.start()
    flood: list[socket.socket] = []
    try:
        assert "gRPC connections: at most 576 (max_connections 4096, open-files limit 1600" in bookie.log_tail(20)
        assert metric(bookie, "pybk_bookie_connection_limit") == 576
        async with await BookieClient.connect(bookie.address, wait=30) as writer:
            await asyncio.gather(*(writer.add(7, i, body(7, i), master_key=KEY) for i in range(100)))
            held_before = metric(bookie, "pybk_bookie_connections")
            for host in ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"):  # 500 each: within the per-peer 512
                flood += await open_idle(bookie.address, 500, source=host)
            refused = await metric_at_least(bookie, 'pybk_bookie_connections_refused_total{reason="max_connections"}',
                                            2000 - (576 - held_before))
            assert refused == 2000 - (576 - held_before)
            assert metric(bookie, "pybk_bookie_connections") == 576
            assert metric(bookie, 'pybk_bookie_connections_refused_total{reason="max_connections_per_peer"}') == 0
            assert sum(map(closed_by_peer, flood)) == refused  # the excess, closed as accepted
            assert descriptors(bookie.pid) < 1600 - 900       # the reserve stays free
            checkpoints = metric(bookie, "pybk_bookie_checkpoints_total")
            await asyncio.gather(*(writer.add(7, i, body(7, i), master_key=KEY) for i in range(100, 200)))
            await metric_at_least(bookie, "pybk_bookie_checkpoints_total", checkpoints + 2)
            assert [e async for e, _ in writer.read_range(7, 0, 199)] == list(range(200))
            async with grpc.aio.insecure_channel(bookie.address, options=OWN_CONNECTION) as late:
                stub = rpc.BookieStub(late)
                with pytest.raises(grpc.aio.AioRpcError) as refused_call:  # a new connection: the port is full
                    await stub.Info(pb.InfoRequest(), timeout=5)
                assert refused_call.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
                close_all(flood)
                flood = []
                await eventually(lambda: metric(bookie, "pybk_bookie_connections") <= held_before + 1, timeout=20,
                                 what="the flood's connections gone")
                info = await eventually(_answers(stub), timeout=30, what="the new client served")
                assert info.ledger_count == 1
        log = bookie.log_path.read_text()
        assert "Too many open files" not in log and "checkpoint failed" not in log
        assert log.count("refused a connection from") == 1  # one line a minute, however many were refused
    finally:
        close_all(flood)
        bookie.kill()


def _answers(stub: rpc.BookieStub):
    async def check():
        try:
            return await stub.Info(pb.InfoRequest(), timeout=5)
        except grpc.aio.AioRpcError:
            return None
    return check


async def test_one_host_gets_at_most_its_share_and_others_are_served(bookies):
    b, = bookies(1, metadata_uri=None, max_connections_per_peer=50)
    hog = await open_idle(b.address, 80, source="127.0.0.2")
    try:
        refused = await metric_at_least(b, 'pybk_bookie_connections_refused_total{reason="max_connections_per_peer"}', 30)
        assert refused == 30 and sum(map(closed_by_peer, hog)) == 30
        async with await BookieClient.connect(b.address, wait=30) as client:  # from 127.0.0.1
            await client.add(3, 0, body(3, 0), master_key=KEY)
            assert await client.read(3, 0) == body(3, 0)
        assert metric(b, 'pybk_bookie_connections_refused_total{reason="max_connections"}') == 0
        log = b.log_path.read_text()
        assert log.count("refused a connection from 127.0.0.2") == 1
        assert "50 connections open from 127.0.0.2 (max_connections_per_peer)" in log
    finally:
        close_all(hog)


async def test_a_connection_that_never_speaks_http2_is_dropped_after_the_handshake_timeout(bookies):
    b, = bookies(1, metadata_uri=None, handshake_timeout=1)
    silent = await open_idle(b.address, 3, preface=False)
    half = await open_idle(b.address, 1, preface=False)
    half[0].send(h2frames.PREFACE[:10])  # a preface cut short
    spoke = await open_idle(b.address, 1)
    try:
        await metric_at_least(b, 'pybk_bookie_connections_closed_total{reason="handshake_timeout"}', 4, timeout=15)
        await eventually(lambda: all(map(closed_by_peer, silent + half)), timeout=10, what="the silent ones closed")
        assert not closed_by_peer(spoke[0])  # it spoke: the idle timeout (300 s) is what applies to it
        assert metric(b, 'pybk_bookie_connections_closed_total{reason="handshake_timeout"}') == 4
    finally:
        close_all(silent + half + spoke)


async def _goaway(reader: asyncio.StreamReader) -> tuple[int, int, str]:
    """(last stream id, error code, text) of the GOAWAY the connection gets."""
    while True:
        head = await asyncio.wait_for(reader.readexactly(9), 20)
        hi, lo, ftype, _, _ = struct.unpack(">BHBBI", head)
        payload = await reader.readexactly((hi << 16) | lo)
        if ftype == h2frames.GOAWAY:
            last, code = struct.unpack_from(">II", payload)
            return last, code, payload[8:].decode()


async def test_an_idle_connection_is_closed_with_goaway_and_clients_reconnect_unawares(bookies):
    """idle_timeout 1 s. A connection with no call gets GOAWAY NO_ERROR and is closed. gRPC's
    channel (reads, Info, ...) reconnects for its next call, also when a call crosses the GOAWAY;
    pybk's Add stream is a call that stays open, so its connection is never idle and keeps
    serving."""
    b, = bookies(1, metadata_uri=None, idle_timeout=1)
    reader, writer = await asyncio.open_connection(*split_address(b.address))
    writer.write(h2frames.PREFACE + h2frames.frame(h2frames.SETTINGS, 0, 0))
    last, code, why = await _goaway(reader)
    assert (last, code) == (0, 0) and why == "idle: no call for 1s"
    assert await asyncio.wait_for(reader.read(), 10) == b""
    writer.close()
    async with await BookieClient.connect(b.address, wait=30) as client:
        await client.add(5, 0, body(5, 0), master_key=KEY)
        stream = client._stream
        for i, pause in enumerate([1.5, 0.9, 1.0, 1.1, 1.2, 0.95, 1.05, 2.0], start=1):
            await asyncio.sleep(pause)  # around the idle timeout: calls cross the GOAWAY now and then
            assert (await client.info())["bookie_id"] == b.bookie_id
            await client.add(5, i, body(5, i), master_key=KEY)
            assert await client.read(5, i) == body(5, i)
        assert client._stream is stream  # the Add stream's connection was never idle: the same stream
        assert metric(b, 'pybk_bookie_connections_closed_total{reason="idle"}') >= 4
        assert [e async for e, _ in client.read_range(5, 0, 8)] == list(range(9))


async def test_a_silent_connection_is_pinged_and_dropped_and_an_answering_one_kept(bookies):
    """keepalive 1 s + 1 s. A client that opened a call and then reads and sends nothing (a host
    gone without a FIN looks the same) is dropped; a gRPC client waiting on a long-poll answers
    the PINGs and gets its answer."""
    b, = bookies(1, metadata_uri=None, keepalive_interval=1, keepalive_timeout=1)
    async with await BookieClient.connect(b.address, wait=30) as client:
        await client.add(6, 0, body(6, 0), master_key=KEY)
        await client.add(6, 1, body(6, 1), master_key=KEY)
        s, = await open_idle(b.address, 1)
        headers = hpack.Encoder().encode([(":method", "POST"), (":scheme", "http"), (":path", "/pybk.Bookie/Add"),
                                          (":authority", "x"), ("content-type", "application/grpc")])
        s.send(h2frames.frame(h2frames.HEADERS, h2frames.END_HEADERS, 1, headers))
        try:
            poll = asyncio.ensure_future(client.wait_lac(6, 0, timeout=4))
            await metric_at_least(b, 'pybk_bookie_connections_closed_total{reason="keepalive"}', 1, timeout=15)
            assert closed_by_peer(s)
            assert await poll == 0  # the long-poll's 4 s ran out on a connection the bookie kept
            assert metric(b, 'pybk_bookie_connections_closed_total{reason="keepalive"}') == 1
        finally:
            s.close()


async def test_a_long_poll_whose_client_went_away_ends_without_an_error_in_the_bookie(bookies):
    """A call in flight when its connection ends (here: the client's GOAWAY) used to answer into
    a transport past its EOF and log RuntimeError from a task nobody awaited."""
    b, = bookies(1, metadata_uri=None)
    async with await BookieClient.connect(b.address, wait=30) as client:
        await client.add(8, 0, body(8, 0), master_key=KEY)
        reader, writer = await asyncio.open_connection(*split_address(b.address))
        headers = hpack.Encoder().encode([(":method", "POST"), (":scheme", "http"), (":path", "/pybk.Bookie/Read"),
                                          (":authority", "x"), ("content-type", "application/grpc")])
        poll = pb.ReadRequest(ledger_id=8, first_entry=-1, last_entry=-1, flags=pb.LONG_POLL, previous_lac=-1,
                              timeout_ms=30_000).SerializeToString()
        writer.write(h2frames.PREFACE + h2frames.frame(h2frames.SETTINGS, 0, 0)
                     + h2frames.frame(h2frames.HEADERS, h2frames.END_HEADERS, 1, headers)
                     + h2frames.frame(h2frames.DATA, h2frames.END_STREAM, 1,
                                      b"\x00" + struct.pack(">I", len(poll)) + poll))
        await writer.drain()
        await asyncio.sleep(0.5)  # the long-poll waits for a LAC above -1
        writer.write(h2frames.frame(h2frames.GOAWAY, 0, 0, struct.pack(">II", 0, 0)))
        await writer.drain()
        await asyncio.sleep(0.1)
        await client.add(8, 1, body(8, 1), master_key=KEY)  # LAC 0: wakes the long-poll while its connection ends
        await asyncio.sleep(1.5)
        writer.close()
        assert await client.read(8, 1) == body(8, 1)
    log = b.log_path.read_text()
    assert "Traceback" not in log and "RuntimeError" not in log and "never retrieved" not in log, log
