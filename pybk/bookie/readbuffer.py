"""The room a bookie's Read streams hold for answers not yet taken by their clients."""
from __future__ import annotations

import asyncio
import logging

from pybk.transport.grpc_server import Throttled

log = logging.getLogger("pybk.bookie.service")
# cancelled Read streams are as many as a client likes: a line per kind a minute
noted = Throttled(logger=log)


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
        if self.try_reserve(nbytes):
            return True
        if not await self._room(nbytes):
            return False
        self.used += nbytes
        return True

    def try_reserve(self, nbytes: int) -> bool:
        """Room for an answer of up to nbytes if there is some now (no waiting), else False."""
        if self.used and self.used + nbytes > self.limit:
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
