"""Named logs' tests run on real `pybk bookie` processes registered in the test's real etcd."""
from __future__ import annotations

import pytest

from pybk.log import failpoints


@pytest.fixture
def cluster(bookies, metadata_uri):
    """Three bookies (short registration lease, so one killed can come back soon); returns the
    metadata URI and the bookie processes."""
    procs = bookies(3, registration_ttl=2)
    return metadata_uri, procs


@pytest.fixture(autouse=True)
def _no_failpoints():
    """A test that arms failpoints never leaves them armed for the next."""
    yield
    failpoints.disarm()
