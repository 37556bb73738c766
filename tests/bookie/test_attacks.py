"""No client can knock a bookie over: each attack that once did (tests/hostile.py, run as a process
of its own with no credential) against a real bookie, while a legitimate writer adds one entry at a
time to a ledger on it. For every attack: the writer sees no error and its p99 stays within
200 ms; the bookie keeps its registration; its RSS stays within 256 MB of what it was idle, and is
back within 64 MB of that 30 s after the attack ends; where the attack breaks HTTP/2's rules, its
connection gets GOAWAY ENHANCE_YOUR_CALM."""
from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import pytest

from pybk.client import BookKeeper
from pybk.meta import MetadataStore
from polling import eventually
from procfs import rss

HOSTILE = Path(__file__).parents[1] / "hostile.py"
MB = 1000 * 1000
ENHANCE_YOUR_CALM = 0xB


class Writer:
    """Adds one entry at a time to its own ledger, keeping each add's latency and any error."""

    def __init__(self, bk: BookKeeper):
        self.bk = bk
        self.latencies: list[float] = []
        self.errors: list[str] = []
        self.ledger = None

    async def start(self) -> None:
        self.ledger = await self.bk.create_ledger(ensemble=1, write_quorum=1, ack_quorum=1, password=b"pw")
        self._stop = asyncio.Event()
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                await asyncio.wait_for(self.ledger.add_entry(b"e" * 1024), 10)
            except Exception as exc:  # noqa: BLE001 - every failure is what the test reports
                self.errors.append(f"{type(exc).__name__}: {exc}")
                return
            self.latencies.append(time.monotonic() - started)
            await asyncio.sleep(0.005)

    def p99(self, since: int = 0) -> float:
        window = sorted(self.latencies[since:])
        return window[int(len(window) * 0.99)] if window else float("inf")

    async def stop(self) -> None:
        self._stop.set()
        await self._task


async def attack(name: str, address: str, **options) -> dict:
    argv = [sys.executable, str(HOSTILE), name, address, *(f"--{k}={v}" for k, v in options.items())]
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()[-2000:]
    return json.loads(out.decode().strip().splitlines()[-1])


@pytest.fixture
async def target(bookies, metadata_uri):
    """(bookie, writer, store): one bookie, a writer adding to it, the metadata to watch its registration."""
    bookie, = bookies(1, registration_ttl=2)
    store = await MetadataStore.connect(metadata_uri)
    bk = await BookKeeper.connect(metadata_uri)
    writer = Writer(bk)
    await writer.start()
    try:
        yield bookie, writer, store
    finally:
        await writer.stop()
        await bk.close()
        await store.close()


async def withstands(target, name: str, **options) -> dict:
    """Run attack `name` against the target bookie and check what every attack must keep."""
    bookie, writer, store = target
    await eventually(lambda: len(writer.latencies) >= 50, 30, what="the writer's first adds")
    idle = rss(bookie.pid)
    peak = [idle]
    registered = [True]
    since = len(writer.latencies)

    async def watch(stop: asyncio.Event) -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], rss(bookie.pid))
            if bookie.bookie_id not in await store.registry.writable():
                registered[0] = False
            await asyncio.sleep(0.1)

    stop = asyncio.Event()
    watcher = asyncio.ensure_future(watch(stop))
    try:
        result = await attack(name, bookie.address, **options)
    finally:
        stop.set()
        await watcher
    assert writer.errors == [], writer.errors
    assert len(writer.latencies) > since, "the writer added nothing during the attack"
    assert writer.p99(since) <= 0.2, f"writer p99 {writer.p99(since) * 1000:.0f} ms during {name}: {result}"
    assert registered[0], f"the bookie lost its registration during {name}"
    assert peak[0] - idle <= 256 * MB, f"RSS grew by {(peak[0] - idle) / MB:.0f} MB during {name}: {result}"
    await eventually(lambda: rss(bookie.pid) - idle <= 64 * MB, 30,
                     what=f"the bookie's RSS back within 64 MB of idle after {name}")
    result["rss_growth_mb"] = (peak[0] - idle) / MB
    result["writer_p99_ms"] = writer.p99(since) * 1000
    print(f"{name}: {result}")  # the figures, shown with pytest -s
    return result


async def test_half_sent_large_messages_stall_on_flow_control(target):
    """300 Add streams each announce an 8 MiB message and send all of it but its last KiB (before:
    2.8 GB of RSS, nothing timed out)."""
    result = await withstands(target, "half_sent_messages", seconds=15)
    assert result["sent"] < 64 * MB


async def test_read_streams_with_no_window_hold_no_more_than_the_answer_budget(target):
    """2 connections x 1,000 Read streams of the writer's ledger, flow-control window 0 (before:
    1.5 GB)."""
    _, writer, _ = target
    await withstands(target, "unread_answers", ledger=writer.ledger.ledger_id, seconds=10, window=0)


async def test_read_streams_on_a_socket_never_read_hold_no_more_than_the_answer_budget(target):
    """The same with a large window, the client never reading its socket (before: 2 GB, and
    1.5 GB still held after the client left)."""
    _, writer, _ = target
    await withstands(target, "unread_answers", ledger=writer.ledger.ledger_id, seconds=10, window=1 << 30)


async def test_settings_frames_full_of_entries_end_the_connection(target):
    """SETTINGS frames of 2,730 entries while 1,000 calls are open (before: the loop blocked 28 s)."""
    result = await withstands(target, "settings_flood")
    assert result["goaway"] == ENHANCE_YOUR_CALM, result


async def test_rapid_reset_ends_the_connection(target):
    """Streams opened and reset at once (before: 144,500 streams in 23 s, no GOAWAY)."""
    result = await withstands(target, "rapid_reset")
    assert result["goaway"] == ENHANCE_YOUR_CALM, result


async def test_empty_continuation_frames_end_the_connection(target):
    """Empty CONTINUATION frames after a HEADERS without its end (before: 20 million accepted)."""
    result = await withstands(target, "empty_continuations")
    assert result["goaway"] == ENHANCE_YOUR_CALM, result
