"""A loopback server that speaks HTTP/2 by hand (frames from h2frames): what a broken, silent,
departing or hostile gRPC server would answer a client (not a test module)."""
from __future__ import annotations

import asyncio
import struct

import hpack

import h2frames


class RawServer:
    """A loopback server that answers its connection with `script(reader, writer, self)`;
    `frames` receives every frame the client sent (type, flags, stream, payload) after its
    preface, as `read_frames` reads them. With `answer_pings` PINGs are acknowledged."""

    def __init__(self, script, answer_pings: bool = False):
        self.script, self.answer_pings = script, answer_pings
        self.frames: list[tuple[int, int, int, bytes]] = []
        self._rx = bytearray()
        self._preface = False
        self.over = asyncio.Event()   # the script returned: the client closed the connection (or it broke)

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self.script(reader, writer, self)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            self.over.set()

    async def read_frames(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                          until=lambda frames: False) -> None:
        """Read the client's frames into `frames` until `until(frames)` or EOF."""
        if not self._preface:
            assert await reader.readexactly(len(h2frames.PREFACE)) == h2frames.PREFACE
            self._preface = True
        while not until(self.frames) and (data := await reader.read(65536)):
            for t, f, s, p in h2frames.frames(self._rx, data):
                self.frames.append((t, f, s, bytes(p)))
                if self.answer_pings and t == h2frames.PING and not f & h2frames.ACK:
                    writer.write(h2frames.frame(h2frames.PING, h2frames.ACK, 0, bytes(p)))


def settings_frame() -> bytes:
    return h2frames.frame(h2frames.SETTINGS, 0, 0)


def goaway_frame(last: int, code: int, debug: bytes) -> bytes:
    return h2frames.frame(h2frames.GOAWAY, 0, 0, struct.pack(">II", last, code) + debug)


def headers_frame(headers: list[tuple[str, str]], flags: int = 0) -> bytes:
    return h2frames.frame(h2frames.HEADERS, h2frames.END_HEADERS | flags, 1, hpack.Encoder().encode(headers))


def scripted(answer: bytes):
    """A server script: read up to the request's headers, write `answer`, then read to the end."""
    async def script(reader, writer, raw: RawServer) -> None:
        await raw.read_frames(reader, writer, until=lambda frames: any(f[0] == h2frames.HEADERS for f in frames))
        writer.write(answer)
        await raw.read_frames(reader, writer)
    return script


def speaking(reader, writer, raw: RawServer):
    """A server script: SETTINGS, then read (and answer nothing unless told to)."""
    writer.write(settings_frame())
    return raw.read_frames(reader, writer)


ANSWER_HEADERS = [(":status", "200"), ("content-type", "application/grpc")]


def data_frames(body: bytes, flags: int = 0, stream: int = 1) -> bytes:
    """`body` as DATA frames of the default frame size, `flags` on the last."""
    cut = range(0, max(len(body), 1), h2frames.DEFAULT_FRAME)
    size = h2frames.DEFAULT_FRAME
    return b"".join(h2frames.frame(h2frames.DATA, flags if k == cut[-1] else 0, stream, body[k:k + size]) for k in cut)


def grpc_message(body: bytes) -> bytes:
    """One gRPC message: its 5-byte prefix and `body`."""
    return struct.pack(">BI", 0, len(body)) + body
