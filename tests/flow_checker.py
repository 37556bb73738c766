"""A TCP relay that checks the HTTP/2 DATA frames a client sends against the server's frame size
and flow-control windows (shared by the client stream tests; not a test module)."""
from __future__ import annotations

import asyncio
import contextlib
import struct

from pybk.transport.ngh2_client import split_address


class FlowChecker:
    """A TCP relay between a client and a server (a bookie) that reads the HTTP/2 frames going by
    and notes every DATA frame the client sends beyond the server's frame size or flow-control
    windows (RFC 9113 section 6.9), settings counting only once the client acknowledged them. A
    server refuses such frames too, but only the relay can say which frame."""

    def __init__(self, target: str):
        self.target = target
        self.violations: list[str] = []
        self._conn = self._stream = 65_535
        self._initial, self._max_frame = 65_535, 16_384
        self._unacked: list[bytes] = []  # the server's SETTINGS the client has not acknowledged yet

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _relay(self, reader, writer) -> None:
        up_reader, up_writer = await asyncio.open_connection(*split_address(self.target))
        await asyncio.gather(self._pipe(reader, up_writer, self._from_client, skip=24),
                             self._pipe(up_reader, writer, self._from_server, skip=0), return_exceptions=True)
        writer.close()
        up_writer.close()

    async def _pipe(self, reader, writer, seen, skip: int) -> None:
        with contextlib.suppress(ConnectionError):
            buf = bytearray()
            while data := await reader.read(1 << 16):
                buf += data
                while skip and buf:
                    cut = min(skip, len(buf))
                    del buf[:cut]
                    skip -= cut
                while len(buf) >= 9:
                    n = int.from_bytes(buf[:3], "big")
                    if len(buf) < 9 + n:
                        break
                    seen(buf[3], buf[4], int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF, bytes(buf[9:9 + n]))
                    del buf[:9 + n]
                writer.write(data)
                await writer.drain()
        writer.close()

    def _from_client(self, ftype: int, flags: int, stream: int, payload: bytes) -> None:
        if ftype == 4 and flags & 1 and self._unacked:  # a SETTINGS ACK: the client may use them now
            self._apply(self._unacked.pop(0))
        if ftype != 0:
            return
        n = len(payload)
        if n > self._max_frame:
            self.violations.append(f"a DATA frame of {n} bytes, frame size {self._max_frame}")
        if n > self._conn or n > self._stream:
            self.violations.append(f"a DATA frame of {n} bytes, windows {self._conn} and {self._stream}")
        self._conn -= n
        self._stream -= n

    def _from_server(self, ftype: int, flags: int, stream: int, payload: bytes) -> None:
        if ftype == 4 and not flags & 1:  # SETTINGS: in force once the client acknowledges them
            self._unacked.append(payload)
        elif ftype == 8:  # WINDOW_UPDATE
            credit = int.from_bytes(payload, "big") & 0x7FFFFFFF
            if stream == 0:
                self._conn += credit
            else:
                self._stream += credit

    def _apply(self, settings: bytes) -> None:
        for k in range(0, len(settings), 6):
            key, value = struct.unpack_from(">HI", settings, k)
            if key == 4:
                self._stream += value - self._initial
                self._initial = value
            elif key == 5:
                self._max_frame = value
