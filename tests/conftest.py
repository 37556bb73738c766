"""Shared fixtures: real etcd and real pybk processes on free loopback ports, always cleaned up.

One etcd serves the whole session; each test sees it under a key prefix of its own (`etcd`), so
tests cannot read each other's metadata. A test that stops, restarts, compacts or secures etcd
is marked `private_etcd` and gets one of its own. Tiers: tests/tiers.py."""
from __future__ import annotations

import itertools
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest

from pybk.bookie.disk import disk_fullness
from pybk.config import BOOKIE
from pybk.local.etcd import EtcdProcess
from shared_etcd import EtcdNamespace
from tiers import TierGuard, assign, says_slow, slow_first

_guard = TierGuard()
_namespaces = itertools.count()
_ram_basetemp = pytest.StashKey[Path]()
SLOW_SECONDS = 30.0
# The suite's Spark JVMs (the session's, and the drivers tests start as child processes) live
# seconds to minutes: compiling with C1 only and a serial collector cuts their CPU by a fifth
# (cgroup CPU of tests/spark/test_spark_source.py: 59 s before, 46 s after).
SPARK_SUBMIT_ARGS = "--driver-java-options '-XX:TieredStopAtLevel=1 -XX:+UseSerialGC' pyspark-shell"
RAM_DISK, RAM_DISK_ROOM = Path("/dev/shm"), 8 << 30


def ram_disk_basetemp() -> Path | None:
    """A fresh directory on the RAM disk when there is one with room for a whole run's data
    (about 1.2 GB): the suite's bookies and etcd fdatasync thousands of times, and on a RAM disk
    those calls cost nothing while running the same code. None where there is no such disk
    (e.g. a container's 64 MB /dev/shm)."""
    try:
        if not RAM_DISK.is_dir() or shutil.disk_usage(RAM_DISK).free < RAM_DISK_ROOM:
            return None
        return Path(tempfile.mkdtemp(prefix="pybk-tests-", dir=RAM_DISK))
    except OSError:
        return None


@pytest.hookimpl(tryfirst=True)  # before the tmp_path plugin reads the base directory
def pytest_configure(config: pytest.Config) -> None:
    if config.option.basetemp is None and not hasattr(config, "workerinput"):
        ram = ram_disk_basetemp()   # xdist workers get a directory under it
        if ram is not None:
            config.option.basetemp = str(ram)
            config.stash[_ram_basetemp] = ram
    os.environ.setdefault("PYSPARK_SUBMIT_ARGS", SPARK_SUBMIT_ARGS)
    config.addinivalue_line("markers", "processes: starts etcd, bookie, Spark, operator or container "
                                       "processes (set from the fixtures; `make test-fast` leaves these out)")
    config.addinivalue_line("markers", "private_etcd: gets an etcd of its own, for a test that stops, "
                                       "restarts, compacts or secures it")
    _guard.install()


def pytest_unconfigure(config: pytest.Config) -> None:
    """The RAM disk directory is memory: it goes with the run (`--basetemp DIR` keeps a run's files)."""
    if (ram := config.stash.get(_ram_basetemp, None)) is not None:
        shutil.rmtree(ram, ignore_errors=True)


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


@pytest.hookimpl(tryfirst=True)   # before xdist's, which reads the groups into the node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    assign(items)
    slow_first(items)   # after pytest-randomly's shuffle, which runs in a wrapper around this hook


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    _guard.current = item
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem):
    """Teardown is not watched: a module's or session's fixtures end in whichever test comes last."""
    _guard.current = None
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    report = (yield).get_result()
    message = _guard.violations.pop(item.nodeid, None)
    if message and not report.failed:
        report.outcome, report.longrepr = "failed", message
    if report.when == "call" and report.duration > SLOW_SECONDS and not says_slow(item):
        report.user_properties.append((_UNEXPLAINED, report.duration))   # travels with the report to xdist's controller


_UNEXPLAINED = "slow-without-a-reason"
_unexplained: list[tuple[str, float]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Collect the slow tests without a reason where reports are logged (xdist's controller)."""
    _unexplained.extend((report.nodeid, seconds) for name, seconds in report.user_properties if name == _UNEXPLAINED)


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    unexplained = _unexplained
    if unexplained:
        terminalreporter.section(f"tests over {SLOW_SECONDS:.0f} s whose docstring has no 'Slow:' line")
        for nodeid, seconds in sorted(unexplained, key=lambda u: -u[1]):
            terminalreporter.line(f"{seconds:6.1f}s {nodeid}")
    seed = getattr(config.option, "randomly_seed", None)
    if isinstance(seed, int) and config.pluginmanager.has_plugin("randomly"):
        terminalreporter.write_line(f"order: shuffled with seed {seed} (make test SEED={seed} runs it again)")


@pytest.fixture(scope="session")
def child_processes():
    """Declares that a test or fixture starts service processes: requesting it puts the test in
    the full tier (tests/tiers.py). Every fixture below that starts one requests it.

    Their `python -m pybk...` processes (bookies, autorecovery, `pybk local up`) are forked from
    one interpreter that has imported pybk (pybk.local.prefork): the same program with the same
    argv, minus the half second of CPU each spent importing. `pybk local` and the shell's
    commands are still spawned as a user runs them."""
    from pybk.local import process
    process.prefork_pybk(True)
    yield
    process.prefork_pybk(False)


@pytest.fixture(scope="session")
def shared_etcd(tmp_path_factory, child_processes) -> EtcdProcess:
    """The session's one etcd, behind every test's `etcd` namespace."""
    proc = EtcdProcess(tmp_path_factory.mktemp("shared-etcd")).start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def etcd(request, tmp_path, child_processes):
    """The test's etcd: the shared one under a key prefix of the test's own, whose keys are
    deleted after the test; with the `private_etcd` mark, a fresh single-member etcd of its own."""
    if request.node.get_closest_marker("private_etcd"):
        proc = EtcdProcess(tmp_path / "etcd-data").start()
        try:
            yield proc
        finally:
            proc.stop()
        return
    name = re.sub(r"[^A-Za-z0-9._-]", "-", request.node.name)[:60]
    view = EtcdNamespace(request.getfixturevalue("shared_etcd"), f"t{next(_namespaces)}-{name}")
    yield view
    view.clear()


@pytest.fixture
def metadata_uri(etcd) -> str:
    """The metadata service URI of the test's etcd."""
    return etcd.metadata_uri("pybk")


@pytest.fixture
def bookies(request, tmp_path, child_processes):
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
