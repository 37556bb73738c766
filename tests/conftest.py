"""Shared fixtures: real etcd and real pybk processes on free loopback ports, always cleaned up."""
from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from pybk.bookie.bookie import disk_fullness
from pybk.config import BOOKIE
from pybk.local.etcd import EtcdProcess


def pytest_sessionstart(session: pytest.Session) -> None:
    """Stop at once, naming the cause, when the disk the tests' bookies write to is already past a
    bookie's default high water mark: every bookie would start read-only and every write fail."""
    where = Path(session.config.option.basetemp or tempfile.gettempdir()).absolute()
    while not where.exists():
        where = where.parent
    used, total = disk_fullness(where)
    limit = BOOKIE.option("high_water_mark").default
    if used >= limit:
        pytest.exit(f"the disk of {where} is {used:.0%} full, at or past the bookies' high water mark "
                    f"({limit:.0%}): they would start read-only and refuse every write; free some space "
                    f"({int(total * (1 - used)) >> 30} GiB free now)", returncode=3)


@pytest.fixture
def etcd(tmp_path):
    """A fresh single-member etcd for one test."""
    proc = EtcdProcess(tmp_path / "etcd-data").start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def metadata_uri(etcd) -> str:
    """The metadata service URI of the test's etcd."""
    return etcd.metadata_uri("pybk")


@pytest.fixture
def bookies(request, tmp_path):
    """Factory of real `pybk bookie` processes: `bookies(3)` starts three on free loopback ports,
    each in its own temp dirs, waits until they are ready, and stops them all after the test.

    By default they register in the test's etcd (the `metadata_uri` fixture); pass
    metadata_uri=None for a bookie with no etcd. Extra keyword options become `pybk bookie` flags
    (e.g. zone="a", high_water_mark=0.5). Each is a pybk.local.bookie.BookieProcess (.address,
    .bookie_id, .kill(), .stop(), .restart())."""
    from pybk.local.bookie import BookieProcess

    started: list[BookieProcess] = []

    def start(count: int = 1, metadata_uri=..., **options) -> list[BookieProcess]:
        if metadata_uri is ...:
            metadata_uri = request.getfixturevalue("metadata_uri")
        procs = [BookieProcess(tmp_path / f"bookie-{len(started) + i}", metadata_uri=metadata_uri, **options)
                 for i in range(count)]
        for p in procs:
            started.append(p)
            p.start(wait=False)
        for p in procs:
            p.wait_started(60)
        return procs

    try:
        yield start
    finally:
        for p in started:
            p.kill()
