"""Helpers shared by the ledger client's tests (not a test module)."""
from __future__ import annotations

import asyncio
import re
import sys
import time
from pathlib import Path

from pybk.local.process import ChildProcess

HERE = Path(__file__).parent


async def pipelined(lh, n: int, window: int = 64, start: int = 0, on_ack=None, before_add=None,
                    errors: list | None = None) -> list[int]:
    """Add payload(lid, i) for i in start..start+n-1 with `window` adds in flight; returns the acked
    ids. `before_add(i)` runs before each add (to inject a fault); failed adds land in `errors`."""
    sem = asyncio.Semaphore(window)
    acked: list[int] = []

    def done(fut):
        sem.release()
        if not fut.cancelled() and fut.exception() is None:
            acked.append(fut.result())
            if on_ack:
                on_ack(fut.result())

    futs = []
    for i in range(start, start + n):
        await sem.acquire()
        if before_add:
            before_add(i)
        f = lh.add_entry_async(payload(lh.ledger_id, i))
        f.add_done_callback(done)
        futs.append(f)
    results = await asyncio.gather(*futs, return_exceptions=True)
    if errors is not None:
        errors.extend(r for r in results if isinstance(r, BaseException))
    return acked


def payload(ledger_id: int, entry_id: int, size: int = 100) -> bytes:
    """The deterministic payload of an entry, so any reader can tell a right entry from a wrong one."""
    head = b"L%d-E%d|" % (ledger_id, entry_id)
    return head + b"x" * max(0, size - len(head))


class ChildWriter(ChildProcess):
    """writer_child.py in its own process group; `acked()` parses what it printed so far."""

    def __init__(self, uri: str, log: Path, e: int = 3, qw: int = 3, qa: int = 2, count: int = -1,
                 window: int = 64):
        super().__init__("writer", [sys.executable, str(HERE / "writer_child.py"), uri, str(e), str(qw),
                                    str(qa), str(count), str(window)], log)

    def _text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    @property
    def ledger_id(self) -> int | None:
        m = re.search(r"^LEDGER (\d+)$", self._text(), re.M)
        return int(m.group(1)) if m else None

    def acked(self) -> list[int]:
        return [int(x) for x in re.findall(r"^ACK (\d+)$", self._text(), re.M)]

    async def wait_acked(self, n: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.acked()) < n:
            if not self.alive():
                raise RuntimeError(f"writer exited early:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"writer acked {len(self.acked())} of {n} in {timeout}s:\n{self.log_tail()}")
            await asyncio.sleep(0.05)


async def read_all(lh, first: int = 0, last: int | None = None) -> list[tuple[int, bytes]]:
    last = lh.last_add_confirmed if last is None else last
    return [(e.entry_id, e.data) async for e in lh.read_entries(first, last)]


def expected(ledger_id: int, last: int, size: int = 100) -> list[tuple[int, bytes]]:
    return [(i, payload(ledger_id, i, size)) for i in range(last + 1)]


def flip_in_entry_logs(bookie, needle: bytes, reseal: bool = True) -> int:
    """Flip one byte inside `needle` in every entry log record of the bookie that holds it, and
    re-seal the record's own CRC: as if the entry was corrupt before the bookie stored it (in a
    writer's memory, say), so only the entry's digest can tell. (The journal is not touched: its
    records are replayed only after the last checkpoint.) Without reseal the record rots on
    disk instead: its CRC no longer matches either."""
    from pybk.bookie.entrylog import LOG_HEADER, LOG_RECORD, record_crc
    flipped = 0
    for d in bookie.ledger_dirs:
        for f in d.rglob("entrylog-*.log"):
            data = bytearray(f.read_bytes())
            pos, changed = 0, False
            while pos + LOG_HEADER <= len(data):
                length, _, ledger, entry = LOG_RECORD.unpack_from(data, pos)
                start, end = pos + LOG_HEADER, pos + LOG_HEADER + length
                at = data.find(needle, start, end)
                if at >= 0:
                    data[at + len(needle) - 1] ^= 0xFF
                    if reseal:
                        LOG_RECORD.pack_into(data, pos, length, record_crc(ledger, entry, bytes(data[start:end])),
                                             ledger, entry)
                    flipped += 1
                    changed = True
                pos = end
            if changed:
                f.write_bytes(bytes(data))
    return flipped
