"""The ledger client's tests run on a cluster of real `pybk bookie` processes (the shared
`bookies` fixture) registered in the test's real etcd."""
from __future__ import annotations

import pytest


class Cluster:
    """The test's bookies by id; restart() brings a killed bookie back on its dirs and ports."""

    def __init__(self, uri: str, start):
        self.uri = uri
        self._start = start
        self.bookies = []

    def add(self, count: int = 1, **options):
        procs = self._start(count, **options)
        self.bookies += procs
        return procs

    def by_id(self, bookie_id: str):
        return next(b for b in self.bookies if b.bookie_id == bookie_id)

    def restart(self, bookie) -> None:
        bookie.restart()

    def report(self) -> str:
        """Each bookie: alive or not, and its log's last lines (for a failure's message)."""
        return "\n".join(f"{b.bookie_id}: {'alive' if b.alive() else 'NOT RUNNING'}\n{b.log_tail(8)}"
                         for b in self.bookies)


@pytest.fixture
def cluster_factory(bookies, metadata_uri):
    """`cluster_factory(n)`: n bookies with a short registration lease, so a bookie killed
    with -9 can register again soon after a restart."""
    def make(count: int, **options) -> Cluster:
        c = Cluster(metadata_uri, bookies)
        c.add(count, registration_ttl=2, **options)
        return c
    return make
