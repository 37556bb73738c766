"""Connections to the bookies autorecovery talks to, found through the registry."""
from __future__ import annotations

import asyncio
import logging

from pybk.client.bookie_client import BookieClient
from pybk.meta.registry import READONLY
from pybk.security.settings import ClientSecurity

log = logging.getLogger(__name__)


class BookieUnavailable(Exception):
    """A bookie is not registered (down) or cannot be reached."""


class BookiePool:
    """One BookieClient per bookie id, resolved through the registry; dropped on errors. Bookies
    are called with `security` (default: the client variables of pybk.security.settings.ENV)."""

    def __init__(self, store, security: ClientSecurity | None = None):
        self.store = store
        self.security = security if security is not None else ClientSecurity.from_env()
        self._clients: dict[str, BookieClient] = {}
        self._addresses: dict[str, str] = {}
        self._lock = asyncio.Lock()

    async def registered(self) -> tuple[dict, dict]:
        """(writable, readonly) registrations: bookie id -> BookieInfo. Refreshes addresses.

        A bookie caught in both directories while switching counts as read-only."""
        writable, readonly = {}, {}
        for bid, (state, info) in (await self.store.registry.all()).items():
            (readonly if state is READONLY else writable)[bid] = info
            self._addresses[bid] = info.grpc
        return writable, readonly

    async def get(self, bookie_id: str) -> BookieClient:
        """A connected client for a registered bookie; BookieUnavailable if it is not registered."""
        client = self._clients.get(bookie_id)
        if client is not None:
            return client
        async with self._lock:
            client = self._clients.get(bookie_id)
            if client is not None:
                return client
            address = self._addresses.get(bookie_id)
            if address is None:
                await self.registered()
                address = self._addresses.get(bookie_id)
            if address is None:
                raise BookieUnavailable(f"bookie {bookie_id} is not registered")
            try:
                client = await BookieClient.connect(address, security=self.security)
            except Exception as exc:
                raise BookieUnavailable(f"bookie {bookie_id} at {address}: {exc}") from exc
            self._clients[bookie_id] = client
            return client

    async def drop(self, bookie_id: str) -> None:
        """Forget a bookie's connection after an error (reconnect on next use)."""
        client = self._clients.pop(bookie_id, None)
        self._addresses.pop(bookie_id, None)
        if client is not None:
            try:
                await client.close()
            except Exception:
                pass

    async def close(self) -> None:
        for bid in list(self._clients):
            await self.drop(bid)
