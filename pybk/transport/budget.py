"""The bytes a server holds for its clients, counted across all its connections.

Each connection has budgets of its own (ngh2_server's notes); this is the process-wide one, so
that many connections, each within its own budget, still cannot add up to more than a pod has.
Requests received ahead of their handler's consumption and answers a client has not read count
against `limit`:
- at `limit / 2` and above, no connection is given flow-control credit ahead of consumption (a
  message larger than its stream window waits until the total falls);
- above `limit`, the connection that holds the most is ended (`evict`): one client's unread answers
  or half-sent messages must not stall everyone else's calls.
Nothing here does I/O: connections report what they hold; the budget decides whom to end.
"""
from __future__ import annotations

from typing import Callable


class ProcessBudget:
    """`used` bytes across connections, each charged under its own key."""

    def __init__(self, limit: int):
        self.limit = limit
        self.used = 0
        self._held: dict[int, int] = {}
        self._evict: dict[int, Callable[[str], None]] = {}

    @property
    def tight(self) -> bool:
        """At half the limit or above: no credit ahead of consumption."""
        return self.used * 2 >= self.limit

    def join(self, key: int, evict: Callable[[str], None]) -> None:
        """A connection: `evict(why)` ends it when it holds the most of an exhausted budget."""
        self._held[key] = 0
        self._evict[key] = evict

    def leave(self, key: int) -> None:
        """A connection is gone: what it held is released."""
        self.used -= self._held.pop(key, 0)
        self._evict.pop(key, None)

    def charge(self, key: int, nbytes: int) -> None:
        """`nbytes` more held by connection `key` (negative: released)."""
        if key not in self._held:
            return
        self._held[key] += nbytes
        self.used += nbytes
        if nbytes > 0 and self.used > self.limit:
            largest = max(self._held, key=self._held.__getitem__)
            evict = self._evict.pop(largest, None)
            if evict is not None:
                evict(f"the server holds more than {self.limit} bytes for its clients and this connection "
                      f"holds the most ({self._held[largest]} bytes)")
