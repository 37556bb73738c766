"""The operator's connections to the clusters it manages: one per metadata URI, made on first use
and kept, dropped when an error shows it broken (the next use connects again)."""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable

log = logging.getLogger(__name__)

METADATA_TIMEOUT = 10.0


class PerUri:
    """Connections of one kind (`what`, e.g. "metadata store"), made by `connect(uri)` within
    METADATA_TIMEOUT and closed by their own `close()`."""

    def __init__(self, connect: Callable[[str], Awaitable[Any]], what: str) -> None:
        self._connect = connect
        self._what = what
        self._open: dict[str, Any] = {}

    async def get(self, uri: str) -> Any:
        conn = self._open.get(uri)
        if conn is None:
            conn = await asyncio.wait_for(self._connect(uri), METADATA_TIMEOUT)
            self._open[uri] = conn
        return conn

    async def drop(self, uri: str) -> None:
        conn = self._open.pop(uri, None)
        if conn is not None:
            try:
                await conn.close()
            except Exception:  # noqa: BLE001 - closing a broken connection must not hide the first error
                log.debug("closing the %s of %s failed", self._what, uri, exc_info=True)

    async def close(self) -> None:
        for uri in list(self._open):
            await self.drop(uri)


async def _metadata_store(uri: str):
    from pybk.meta import MetadataStore
    return await MetadataStore.connect(uri)


async def _bookkeeper(uri: str):
    from pybk.client import BookKeeper
    return await BookKeeper.connect(uri)


def metadata_stores() -> PerUri:
    """One MetadataStore per cluster (BookieCluster handlers)."""
    return PerUri(_metadata_store, "metadata store")


def bookkeepers() -> PerUri:
    """One BookKeeper client per cluster (BookieLog handlers)."""
    return PerUri(_bookkeeper, "BookKeeper client")
