"""A thin synchronous facade over named logs for scripts, on the sync ledger client's event loop.

    from pybk.client.sync import BookKeeper
    from pybk.log.sync import Logs
    with BookKeeper.connect("etcd://127.0.0.1:2379/pybk") as bk:
        logs = Logs(bk)
        logs.create("orders", password=b"pw")
        with logs.open_writer("orders", password=b"pw") as w:
            w.append(b"order 1"); w.append_many([b"order 2", b"order 3"])
        for rec in logs.read("orders"): print(rec.offset, rec.payload)
"""
from __future__ import annotations

from typing import Iterable, Iterator

from pybk.client import sync as client_sync

from . import logs as _logs
from .codec import LogRecord
from .options import LogConfig, WriterOptions


class LogWriter:
    """Blocking twin of `pybk.log.LogWriter` (appends wait for their acknowledgement; append_many
    pipelines a whole list)."""

    def __init__(self, loop, writer):
        self._loop = loop
        self._w = writer

    @property
    def epoch(self) -> int:
        return self._w.epoch

    @property
    def next_offset(self) -> int:
        return self._w.next_offset

    def append(self, payload: bytes, *, key: bytes | None = None, timestamp: int | None = None,
               sequence: int | None = None) -> int:
        return self._loop.run_until_complete(self._w.append(payload, key=key, timestamp=timestamp, sequence=sequence))

    def append_many(self, payloads: Iterable[bytes], *, timestamp: int | None = None) -> range:
        return self._loop.run_until_complete(self._w.append_many(payloads, timestamp=timestamp))

    def flush(self) -> None:
        self._loop.run_until_complete(self._w.flush())

    def close(self) -> None:
        self._loop.run_until_complete(self._w.close())

    def __enter__(self) -> "LogWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Logs:
    """Blocking twin of `pybk.log.Logs`, on a `pybk.client.sync.BookKeeper`."""

    def __init__(self, bk: client_sync.BookKeeper):
        self._loop = bk._loop
        self._logs = _logs.Logs(bk._bk)

    def _run(self, coro):
        return self._loop.run_until_complete(coro)

    def create(self, name: str, config: LogConfig | None = None, *, password: bytes | None = None) -> _logs.LogRef:
        return self._run(self._logs.create(name, config, password=password))

    def list(self) -> list[str]:
        return self._run(self._logs.list())

    def describe(self, name: str, password: bytes | None = None) -> _logs.LogDescription:
        return self._run(self._logs.describe(name, password))

    def open_writer(self, name: str, *, password: bytes, options: WriterOptions | None = None) -> LogWriter:
        return LogWriter(self._loop, self._run(self._logs.open_writer(name, password=password, options=options)))

    def read(self, name: str, *, start: _logs.Start = "earliest", cursor: str | None = None,
             at_time: int | None = None, end: int | str = "latest", password: bytes | None = None,
             batch: int = 1000) -> Iterator[LogRecord]:
        """Records from a position to `end` (default: the end now), fetched `batch` at a time.
        Tailing forever is for the asyncio API (end=None)."""
        if end is None:
            raise ValueError("the sync facade reads to an end; tail with the asyncio API (end=None)")
        reader = self._run(self._logs.open_reader(name, start=start, cursor=cursor, at_time=at_time, end=end,
                                                  password=password))
        try:
            while True:
                got = self._run(reader.read(batch))
                if not got:
                    return
                yield from got
        finally:
            self._run(reader.close())

    def end_offset(self, name: str, password: bytes | None = None) -> int:
        return self._run(self._logs.end_offset(name, password))

    def offset_at_time(self, name: str, timestamp: int, password: bytes | None = None) -> int:
        return self._run(self._logs.offset_at_time(name, timestamp, password))

    def commit(self, name: str, cursor: str, offset: int) -> int:
        return self._run(self._logs.commit(name, cursor, offset))

    def cursors(self, name: str, password: bytes | None = None) -> list[_logs.CursorInfo]:
        return self._run(self._logs.cursors(name, password))

    def truncate(self, name: str, before: int, *, password: bytes | None = None, force: bool = False) -> int:
        return self._run(self._logs.truncate(name, before, password=password, force=force))

    def delete(self, name: str, *, password: bytes | None = None, force: bool = False) -> None:
        self._run(self._logs.delete(name, password=password, force=force))

    def reclaim_orphans(self, *, password: bytes | None = None, force: bool = False,
                        log_name: str | None = None) -> list[tuple[int, str]]:
        return self._run(self._logs.reclaim_orphans(password=password, force=force, log_name=log_name))
