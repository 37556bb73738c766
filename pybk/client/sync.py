"""A thin synchronous facade for scripts: each call runs the asyncio client on an event loop
owned by the calling thread.

    from pybk.client.sync import BookKeeper
    with BookKeeper.connect("etcd://127.0.0.1:2379/pybk") as bk:
        lh = bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2, password=b"pw")
        lh.add_entry(b"x"); lh.close()
        for e in bk.open_ledger(lh.ledger_id, password=b"pw").read_entries(0, 0): print(e.data)
"""
from __future__ import annotations

import asyncio
from typing import Iterator

from pybk import eventloop
from pybk.entry import DigestType

from . import bookkeeper as _bk
from .types import LedgerEntry


class LedgerHandle:
    """Blocking twin of `pybk.client.LedgerHandle`."""

    def __init__(self, loop: asyncio.AbstractEventLoop, handle):
        self._loop = loop
        self._h = handle

    @property
    def ledger_id(self) -> int:
        return self._h.ledger_id

    @property
    def metadata(self):
        return self._h.metadata

    @property
    def last_add_confirmed(self) -> int:
        return self._h.last_add_confirmed

    def add_entry(self, data: bytes) -> int:
        return self._loop.run_until_complete(self._h.add_entry(data))

    def add_entries(self, payloads: list[bytes]) -> list[int]:
        """Add many entries pipelined; returns their ids once all are acked."""
        async def go():
            return list(await asyncio.gather(*(self._h.add_entry_async(p) for p in payloads)))
        return self._loop.run_until_complete(go())

    def close(self) -> None:
        self._loop.run_until_complete(self._h.close())

    def read_entries(self, first: int, last: int) -> list[LedgerEntry]:
        async def go():
            return [e async for e in self._h.read_entries(first, last)]
        return self._loop.run_until_complete(go())

    def read_last_add_confirmed(self) -> int:
        return self._loop.run_until_complete(self._h.read_last_add_confirmed())

    def wait_last_add_confirmed(self, previous: int, timeout: float = 10.0) -> int:
        return self._loop.run_until_complete(self._h.wait_last_add_confirmed(previous, timeout))

    def __enter__(self) -> "LedgerHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class BookKeeper:
    """Blocking twin of `pybk.client.BookKeeper`; owns its event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, bk: _bk.BookKeeper):
        self._loop = loop
        self._bk = bk

    @classmethod
    def connect(cls, uri: str, options: _bk.ClientOptions | None = None) -> "BookKeeper":
        loop = eventloop.new_loop()
        try:
            return cls(loop, loop.run_until_complete(_bk.BookKeeper.connect(uri, options)))
        except BaseException:
            loop.close()
            raise

    def create_ledger(self, ensemble: int | None = None, write_quorum: int | None = None, ack_quorum: int | None = None,
                      digest: DigestType = DigestType.CRC32C, password: bytes | None = None,
                      metadata: dict[str, bytes] | None = None) -> LedgerHandle:
        return LedgerHandle(self._loop, self._loop.run_until_complete(self._bk.create_ledger(
            ensemble, write_quorum, ack_quorum, digest, password, metadata)))

    def open_ledger(self, ledger_id: int, password: bytes = b"", recovery: bool = True) -> LedgerHandle:
        return LedgerHandle(self._loop, self._loop.run_until_complete(
            self._bk.open_ledger(ledger_id, password, recovery)))

    def delete_ledger(self, ledger_id: int, password: bytes | None = None, force: bool = False) -> None:
        self._loop.run_until_complete(self._bk.delete_ledger(ledger_id, password, force))

    def list_ledgers(self) -> Iterator[int]:
        async def go():
            return [lid async for lid in self._bk.list_ledgers()]
        return iter(self._loop.run_until_complete(go()))

    def ledger_metadata(self, ledger_id: int):
        return self._loop.run_until_complete(self._bk.ledger_metadata(ledger_id))

    def close(self) -> None:
        if not self._loop.is_closed():
            try:
                self._loop.run_until_complete(self._bk.close())
            finally:
                self._finish_tasks()
                self._loop.close()

    def _finish_tasks(self) -> None:
        """Cancel what is still running on the loop (as asyncio.run does) so nothing is left pending."""
        tasks = [t for t in asyncio.all_tasks(self._loop) if not t.done()]
        for t in tasks:
            t.cancel()
        if tasks:
            self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))

    def __enter__(self) -> "BookKeeper":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
