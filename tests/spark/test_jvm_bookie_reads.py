"""The JVM's Read transport (pybk.spark.jvm: Netty's HTTP/2 codec, gRPC framing and protobuf by hand)
against real `pybk bookie` processes, plain and secured, and against raw HTTP/2 servers that answer
what a broken or hostile bookie could. The driver is the jar's ReadTool, run as its own JVM: what it
prints per entry (id, size, CRC32 of the body) is compared with what the Python client reads."""
from __future__ import annotations

import asyncio
import random
import shutil
import socket
import struct
import time
import zlib

import pytest

import h2frames
from raw_h2_server import ANSWER_HEADERS, RawServer, data_frames, grpc_message, headers_frame, scripted, settings_frame

from pybk import entry
from pybk.client import BookKeeper
from pybk.client.bookie_client import BookieClient
from pybk.local import control
from pybk.local.client import read_client
from pybk.spark.jvm import build, javac, spark_jars

KEY = entry.master_key(b"secret")
TRANSPORT, NO_LEDGER, NO_ENTRY = -1, 1, 2
UNAUTHENTICATED, PERMISSION_DENIED = 1016, 1007
SMALL_HEAP = ("-Xmx64m", "-XX:MaxDirectMemorySize=64m")


@pytest.fixture(scope="module")
def jar(child_processes):
    """The jar of the current sources, built once for the module."""
    if javac() is None or shutil.which("java") is None:
        pytest.skip("no JDK (javac and java): the JVM reader cannot be built")
    return build()


class Run:
    """What one ReadTool run printed: its answers (first, count, bytes), entries (id, size, crc32),
    and its last line (`end`, `closed` or `error STATUS MESSAGE`)."""

    def __init__(self, code: int, out: str, err: str, seconds: float):
        self.code, self.err, self.seconds = code, err, seconds
        lines = out.splitlines()
        self.answers = [tuple(map(int, ln.split()[1:])) for ln in lines if ln.startswith("answer ")]
        self.entries = [tuple(map(int, ln.split()[1:])) for ln in lines if ln.startswith("entry ")]
        self.last = lines[-1] if lines else ""

    @property
    def status(self) -> int:
        assert self.last.startswith("error "), self.last
        return int(self.last.split()[1])


async def read_tool(jar, address: str, ledger: int, first: int, last: int, *options: str,
                    jvm: tuple[str, ...] = (), timeout: float = 120) -> Run:
    """ReadTool's run, as its own JVM (asynchronously: a raw server may be answering it meanwhile)."""
    start = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        "java", *jvm, "-cp", f"{jar}:{spark_jars()}/*", "pybk.spark.jvm.ReadTool", address, str(ledger),
        str(first), str(last), *options, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError(f"ReadTool did not end within {timeout} s") from None
    return Run(proc.returncode, out.decode(), err.decode(), time.monotonic() - start)


async def python_reads(address: str, ledger: int, first: int, last: int, **kwargs) -> list[tuple[int, int, int]]:
    """(id, size, crc32) of each entry the Python client's read_packed gets from the bookie."""
    got = []
    async with await BookieClient.connect(address, **kwargs) as c:
        async for eid, bodies, sizes in c.read_packed(ledger, first, last, digests_checked=True):
            pos = 0
            for i, size in enumerate(sizes.tolist()):
                got.append((eid + i, size, zlib.crc32(bodies[pos:pos + size])))
                pos += size
    return got


def payload(i: int) -> bytes:
    """Entry i's data: empty, small, 64 KiB and in between, in turn."""
    size = (0, 1, 100, 4000, 65536, random.Random(i).randrange(70_000))[i % 6]
    return random.Random(i).randbytes(size)


async def write_ledger(uri: str, count: int, **kwargs) -> tuple[int, list[str]]:
    """A closed ledger of `count` entries on three bookies (E = Qw = 3): its id and its bookies' ids."""
    async with await BookKeeper.connect(uri, **kwargs) as bk:
        lh = await bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2, password=b"pw")
        for k in range(0, count, 500):
            await asyncio.gather(*(lh.add_entry_async(payload(i)) for i in range(k, min(k + 500, count))))
        await lh.close()
        return lh.ledger_id, list(lh.metadata.fragments[0].bookies)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_reads_equal_the_python_clients_and_errors_name_their_cause(jar, bookies, metadata_uri):
    """A ledger of mixed entry sizes (0 B to 68 KiB) read whole and in parts from one bookie: every
    entry's id, size and CRC32 are what the Python client reads from the same bookie. A ledger the
    bookie does not hold is NO_LEDGER; a range past the end delivers the entries before its end, then
    NO_ENTRY naming the first missing one; a port with nothing listening is a connect error."""
    procs = bookies(3)
    count = 3000
    lid, _ = await write_ledger(metadata_uri, count)
    address = procs[1].address
    for first, last in [(0, count - 1), (0, 0), (17, 1234), (count - 6, count - 1)]:
        run = await read_tool(jar, address, lid, first, last)
        assert run.code == 0 and run.last == "end", run.last + run.err[-2000:]
        assert run.entries == await python_reads(address, lid, first, last)
        assert [e[0] for e in run.entries] == list(range(first, last + 1))
        assert sum(a[1] for a in run.answers) == len(run.entries)

    run = await read_tool(jar, address, lid + 1000, 0, 10)
    assert run.code == 1 and run.status == NO_LEDGER and f"bookie {address}: NO_LEDGER" in run.last

    run = await read_tool(jar, address, lid, count - 3, count + 10)
    assert run.code == 1 and run.status == NO_ENTRY and f"NO_ENTRY (entry {count})" in run.last, run.last
    assert [e[0] for e in run.entries] == [count - 3, count - 2, count - 1]

    dead = f"127.0.0.1:{free_port()}"
    run = await read_tool(jar, dead, lid, 0, 10, "--timeout-ms", "5000")
    assert run.code == 1 and run.status == TRANSPORT, run.last
    assert f"bookie {dead}: cannot connect" in run.last and "refused" in run.last.lower(), run.last
