"""The event loop a process runs on: auto takes uvloop when installed, a missing uvloop is refused
with its cause, and bookies and clients on either loop store and return the same bytes."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from pybk import eventloop
from pybk.client import BookKeeper
from pybk.client import sync
from pybk.eventloop import EventLoop, EventLoopError

HAVE_UVLOOP = eventloop.uvloop_installed()
LOOPS = [EventLoop.ASYNCIO,
         pytest.param(EventLoop.UVLOOP, marks=pytest.mark.skipif(not HAVE_UVLOOP, reason="uvloop is not installed"))]
HIDE_UVLOOP = "import sys; sys.modules['uvloop'] = None; from pybk.cli import main; sys.exit(main(sys.argv[1:]))"


def test_auto_takes_uvloop_when_installed_and_asyncio_otherwise():
    assert eventloop.resolve(EventLoop.AUTO, installed=True) is EventLoop.UVLOOP
    assert eventloop.resolve("auto", installed=False) is EventLoop.ASYNCIO
    assert eventloop.resolve("ASYNCIO", installed=True) is EventLoop.ASYNCIO
    assert eventloop.resolve(EventLoop.UVLOOP, installed=True) is EventLoop.UVLOOP


def test_unset_variable_means_auto_and_the_variable_chooses(monkeypatch):
    monkeypatch.delenv(eventloop.ENV, raising=False)
    assert eventloop.from_env() is EventLoop.AUTO
    monkeypatch.setenv(eventloop.ENV, "asyncio")
    assert eventloop.resolve(None, installed=True) is EventLoop.ASYNCIO
    assert type(eventloop.new_loop()) is type(asyncio.new_event_loop())


def test_an_unknown_loop_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="not an event loop: 'trio' .use auto, asyncio, uvloop."):
        eventloop.parse_event_loop("trio")


def test_asking_for_uvloop_without_it_names_the_cause(tmp_path):
    with pytest.raises(EventLoopError, match="^event loop uvloop is not installed"):
        eventloop.resolve(EventLoop.UVLOOP, installed=False)
    proc = subprocess.run([sys.executable, "-c", HIDE_UVLOOP, "bookie", "--event-loop", "uvloop",
                           "--journal-dir", str(tmp_path / "j"), "--ledger-dir", str(tmp_path / "l"),
                           "--port", "0", "--http-port", "0"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.splitlines()[0] == ("pybk bookie: refusing to start: event loop uvloop is not installed "
                                           "(pip install 'pybk[uvloop]', or use --event-loop asyncio)")
    assert not (tmp_path / "j").exists() or not any((tmp_path / "j").iterdir())


def ready_event(bookie) -> dict:
    for line in bookie.log_path.read_text().splitlines():
        if line.startswith("{") and json.loads(line).get("event") == "ready":
            return json.loads(line)
    raise AssertionError(f"no ready event in {bookie.log_path}")


@pytest.mark.parametrize("loop", LOOPS)
async def test_bookies_on_either_loop_store_and_return_the_same_bytes(loop, bookies, metadata_uri):
    procs = bookies(3, event_loop=loop.value)
    assert [ready_event(p)["event_loop"] for p in procs] == [loop.value] * 3
    payloads = [b"entry-%d|" % i + bytes([i % 251]) * (i * 7) for i in range(300)]
    async with await BookKeeper.connect(metadata_uri) as bk:
        lh = await bk.create_ledger(3, 3, 2, password=b"pw")
        await asyncio.gather(*(lh.add_entry_async(p) for p in payloads))
        await lh.close()
        rh = await bk.open_ledger(lh.ledger_id, password=b"pw")
        assert [e.data async for e in rh.read_entries(0, len(payloads) - 1)] == payloads


@pytest.mark.parametrize("loop", LOOPS)
def test_blocking_client_runs_on_the_loop_the_variable_names(loop, bookies, metadata_uri, monkeypatch):
    bookies(3)
    monkeypatch.setenv(eventloop.ENV, loop.value)
    bk = sync.BookKeeper.connect(metadata_uri)
    try:
        assert bk._loop.run_until_complete(_running()) is loop
        lh = bk.create_ledger(3, 2, 2, password=b"pw")
        lh.add_entries([b"a", b"bb", b"ccc"])
        assert [e.data for e in lh.read_entries(0, 2)] == [b"a", b"bb", b"ccc"]
        lh.close()
    finally:
        bk.close()


async def _running() -> EventLoop:
    return eventloop.running()
