"""The JVM's Read transport (pybk.spark.jvm: Netty's HTTP/2 codec, gRPC framing and protobuf by hand)
against real `pybk bookie` processes, plain and secured, and against raw HTTP/2 servers that answer
what a broken or hostile bookie could. The driver is the jar's ReadTool, run as its own JVM: what it
prints per entry (id, size, CRC32 of the body) is compared with what the Python client reads."""
from __future__ import annotations

import asyncio
import random
import struct
import time
import zlib

import hpack
import pytest

import h2frames
from raw_h2_server import ANSWER_HEADERS, RawServer, data_frames, grpc_message, settings_frame

from pybk import entry
from pybk.client import BookKeeper
from pybk.client.bookie_client import BookieClient
from pybk.local.client import read_client
from pybk.local.process import free_port
from pybk.security.ca import CertificateAuthority
from pybk.spark.jvm import SHORT_RUN, java_command

KEY = entry.master_key(b"secret")
TRANSPORT, NO_LEDGER, NO_ENTRY = -1, 1, 2
UNAUTHENTICATED, PERMISSION_DENIED = 1016, 1007
SMALL_HEAP = ("-Xmx64m", "-XX:MaxDirectMemorySize=64m")
LEAKS = ("-Dio.netty.leakDetection.level=paranoid",)   # with --leak-check: every buffer not released is reported


class Run:
    """What one ReadTool run printed: its answers (first, count, bytes), entries (id, size, crc32),
    and its last line (`end`, `closed` or `error STATUS MESSAGE`)."""

    def __init__(self, code: int, out: str, err: str, seconds: float):
        self.code, self.err, self.seconds = code, err, seconds
        lines = out.splitlines()
        self.answers = [tuple(map(int, ln.split()[1:])) for ln in lines if ln.startswith("answer ")]
        self.entries = [tuple(map(int, ln.split()[1:])) for ln in lines if ln.startswith("entry ")]
        self.memory = next((int(ln.split()[1]) for ln in lines if ln.startswith("memory ")), None)
        ends = [ln for ln in lines if ln in ("end", "closed") or ln.startswith("error ")]
        self.last = ends[-1] if ends else ""
        assert "LEAK:" not in out + err, (out + err)[-3000:]

    @property
    def status(self) -> int:
        assert self.last.startswith("error "), self.last
        return int(self.last.split()[1])


async def read_tool(jar, address: str, ledger: int, first: int, last: int, *options: str,
                    jvm: tuple[str, ...] = (), timeout: float = 120) -> Run:
    """ReadTool's run, as its own JVM (asynchronously: a raw server may be answering it meanwhile)."""
    start = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *java_command(jar, "ReadTool", SHORT_RUN + tuple(jvm)), address, str(ledger),
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
    """A closed ledger of `count` entries on three bookies (E = Qw = Qa = 3: every bookie holds every
    entry once it is closed): its id and its bookies' ids."""
    async with await BookKeeper.connect(uri, **kwargs) as bk:
        lh = await bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=3, password=b"pw")
        for k in range(0, count, 500):
            await asyncio.gather(*(lh.add_entry_async(payload(i)) for i in range(k, min(k + 500, count))))
        await lh.close()
        return lh.ledger_id, list(lh.metadata.fragments[0].bookies)


async def test_reads_equal_the_python_clients_and_errors_name_their_cause(jar, bookies, metadata_uri):
    """A ledger of mixed entry sizes (0 B to 68 KiB) read whole and in parts from one bookie: every
    entry's id, size and CRC32 are what the Python client reads from the same bookie, in each of four
    concurrent calls on the JVM's shared connection, and no buffer is left unreleased. A ledger the
    bookie does not hold is NO_LEDGER; a range past the end delivers the entries before its end, then
    NO_ENTRY naming the first missing one; a port with nothing listening is a connect error.

    Slow: seven JVMs start (2-3 s each), and 1200 entries are written and read back by both clients."""
    procs = bookies(3)
    count = 1200
    lid, _ = await write_ledger(metadata_uri, count)
    address = procs[1].address
    for first, last in [(0, count - 1), (0, 0), (17, 1001), (count - 6, count - 1)]:
        run = await read_tool(jar, address, lid, first, last, "--calls", "4", "--leak-check", jvm=LEAKS)
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


def tls_options(security) -> list[str]:
    """ReadTool's options for a client's TLS settings (CA, and its certificate and key if it has them)."""
    options = ["--ca", security.tls_ca]
    if security.tls_cert:
        options += ["--cert", security.tls_cert, "--key", security.tls_key]
    return options


async def test_tls_and_token_on_a_secured_cluster(jar, secured, tmp_path):
    """With the cluster's CA and a token, reads over TLS (ALPN h2, the server checked against the CA
    and the dialled address) equal the Python client's. A wrong token is refused by the bookie,
    named UNAUTHENTICATED; the TLS port dialled in plaintext, or TLS without the server's CA, fails
    as a transport error naming the bookie, and so does a server name the certificate does not name.

    Slow: a secured local cluster starts (etcd with auth, three TLS bookies), then six JVMs."""
    cluster = read_client(secured)
    security = cluster.security
    lid, bookie_ids = await write_ledger(cluster.metadata_uri, 300, security=security)
    async with await BookKeeper.connect(cluster.metadata_uri, security=security) as bk:
        address = (await bk.client(bookie_ids[0])).address
    run = await read_tool(jar, address, lid, 0, 299, *tls_options(security), "--token-file", security.token_file)
    assert run.code == 0 and run.last == "end", run.last + run.err[-2000:]
    assert run.entries == await python_reads(address, lid, 0, 299, security=security)
    assert [e[0] for e in run.entries] == list(range(300))

    wrong = tmp_path / "wrong.token"
    wrong.write_text("not-a-token\n")
    run = await read_tool(jar, address, lid, 0, 299, *tls_options(security), "--token-file", str(wrong))
    assert run.code == 1 and run.status in (UNAUTHENTICATED, PERMISSION_DENIED), run.last
    assert f"bookie {address}: UNAUTHENTICATED" in run.last or "PERMISSION_DENIED" in run.last

    run = await read_tool(jar, address, lid, 0, 299, "--token-file", security.token_file, "--timeout-ms", "10000")
    assert run.code == 1 and run.status == TRANSPORT, run.last
    assert f"bookie {address}: cannot connect" in run.last and "dialled without TLS" in run.last, run.last

    other = tmp_path / "other-ca.crt"
    other.write_bytes(CertificateAuthority.create().cert_pem)
    run = await read_tool(jar, address, lid, 0, 299, "--ca", str(other), "--token-file", security.token_file)
    assert run.code == 1 and run.status == TRANSPORT and f"bookie {address}: cannot connect" in run.last, run.last

    # the certificate names localhost and 127.0.0.1: an override server name is checked instead of the host
    token = ["--token-file", security.token_file]
    run = await read_tool(jar, address, lid, 0, 9, *tls_options(security), "--server-name", "localhost", *token)
    assert run.code == 0 and len(run.entries) == 10, run.last
    run = await read_tool(jar, address, lid, 0, 9, *tls_options(security), "--server-name", "elsewhere.test", *token)
    assert run.code == 1 and run.status == TRANSPORT and "cannot connect" in run.last, run.last


def read_results(first: int, bodies: list[bytes]) -> bytes:
    """A packed ReadResults (status OK): first_body_entry, the bodies and their sizes (packed)."""
    def varint(v: int) -> bytes:
        out = bytearray()
        while v >= 0x80:
            out.append(v & 0x7F | 0x80)
            v >>= 7
        return bytes(out + bytes([v]))
    joined = b"".join(bodies)
    sizes = b"".join(varint(len(b)) for b in bodies)
    return b"\x30" + varint(first) + b"\x3a" + varint(len(joined)) + joined + b"\x42" + varint(len(sizes)) + sizes


def headers(sid: int, fields: list[tuple[str, str]], flags: int = 0) -> bytes:
    return h2frames.frame(h2frames.HEADERS, h2frames.END_HEADERS | flags, sid, hpack.Encoder().encode(fields))


def answering(answer):
    """A raw server's script: SETTINGS, then `answer(stream id)` once the client's request headers came,
    then read to the end (the frames the client sent are in RawServer.frames)."""
    async def script(reader, writer, raw: RawServer) -> None:
        writer.write(settings_frame())
        await raw.read_frames(reader, writer, until=lambda frames: any(f[0] == h2frames.HEADERS for f in frames))
        sid = next(f[2] for f in raw.frames if f[0] == h2frames.HEADERS)
        writer.write(answer(sid))
        await raw.read_frames(reader, writer)
    return script


def call(*messages: bytes, end: bool = True, extra: bytes = b""):
    """An answer: the response headers, the gRPC messages, then `extra` and trailers grpc-status 0
    unless not `end`."""
    def answer(sid: int) -> bytes:
        body = b"".join(grpc_message(m) for m in messages) + extra
        out = headers(sid, ANSWER_HEADERS) + (data_frames(body, stream=sid) if body else b"")
        return out + (headers(sid, [("grpc-status", "0")], h2frames.END_STREAM) if end else b"")
    return answer


def reset_by_client(raw: RawServer) -> bool:
    """Whether the client reset its call's stream (RST_STREAM CANCEL)."""
    sid = next(f[2] for f in raw.frames if f[0] == h2frames.HEADERS)
    return (h2frames.RST_STREAM, 0, sid, struct.pack(">I", 8)) in raw.frames


@pytest.mark.parametrize("answer, cause", [
    (call(end=False, extra=struct.pack(">BI", 0, 2 ** 31)),
     "a message of 2147483648 bytes, over the limit of 16777216"),
    (call(b"\x30\xff"), "malformed ReadResults: a truncated varint"),
    (call(b"\x3a\x10abc"), "malformed ReadResults: field 7 of 16 bytes where 3 are left"),
    (call(b"\x30\x00\x3a\x03abc\x42\x01\x05"),
     "malformed ReadResults: body sizes adding up to 5 bytes for 3 bytes of bodies"),
    (call(extra=struct.pack(">BI", 1, 3) + b"abc"), "compression is not supported"),
    (lambda sid: headers(sid, ANSWER_HEADERS) + data_frames(grpc_message(read_results(0, [b"ab"])), h2frames.END_STREAM,
                                                            stream=sid),
     "the call ended without trailers"),
    (call(read_results(0, [b"ab"]), extra=b"\x00\x00\x00"), "the call ended inside a message"),
    (lambda sid: headers(sid, [*ANSWER_HEADERS, ("grpc-status", "8"), ("grpc-message", "too%20busy")],
                         h2frames.END_STREAM), "RESOURCE_EXHAUSTED (gRPC status 8): too busy"),
], ids=["2GiB-prefix", "truncated-varint", "length-past-end", "sizes-not-bodies", "compressed", "no-trailers",
        "inside-a-message", "grpc-status"])
async def test_a_hostile_server_fails_the_call_naming_the_cause(jar, answer, cause):
    """What a broken or hostile bookie answers fails the call, naming the bookie and the cause, in a JVM
    of 64 MiB: a 2 GiB length prefix is refused from the prefix, before anything is held; protobuf
    that runs past its end or does not add up is a BookieReadException, not an index error."""
    raw = RawServer(answering(answer))
    address = await raw.start()
    run = await read_tool(jar, address, 1, 0, 10, "--timeout-ms", "10000", "--leak-check", jvm=SMALL_HEAP + LEAKS)
    assert run.code == 1 and f"bookie {address}:" in run.last and cause in run.last, run.last + run.err[-2000:]
    assert "Exception in thread" not in run.err and "OutOfMemoryError" not in run.err, run.err[-2000:]


async def test_a_stalled_server_fails_the_call_within_its_timeout(jar):
    """A server that answers the headers and then nothing: the call fails after the wait for an
    answer, naming it, and resets its stream."""
    raw = RawServer(answering(call(end=False)))
    address = await raw.start()
    run = await read_tool(jar, address, 1, 0, 10, "--timeout-ms", "2000", "--leak-check", jvm=SMALL_HEAP + LEAKS)
    assert run.code == 1 and run.status == TRANSPORT and f"bookie {address}: no answer within 2000 ms" in run.last
    assert run.seconds < 15
    await asyncio.wait_for(raw.over.wait(), 10)
    assert reset_by_client(raw)


async def test_closing_a_stream_mid_way_resets_it(jar):
    """A consumer that stops after the first answer of an unfinished call closes its stream: the
    server gets RST_STREAM (CANCEL) for it, and the answers it had buffered are released."""
    raw = RawServer(answering(call(*(read_results(3 * k, [b"x" * 10] * 3) for k in range(3)), end=False)))
    address = await raw.start()
    run = await read_tool(jar, address, 1, 0, 100, "--close-after", "1", "--timeout-ms", "10000", "--leak-check",
                          jvm=LEAKS)
    assert run.code == 0 and run.last == "closed" and run.answers == [(0, 3, 30)], run.last + run.err[-2000:]
    await asyncio.wait_for(raw.over.wait(), 10)
    assert reset_by_client(raw)


async def test_a_large_range_read_slowly_stays_within_a_small_heap(jar, bookies):
    """About 120 MiB of entries read by a consumer that sleeps after each answer, in a JVM of 64 MiB
    heap and 64 MiB direct memory: the call holds a stream window and a few answers, not the range
    (Netty's direct memory stays under 28 MiB while the bookie could send far faster).

    Slow: it stores 120 MiB on a bookie and reads it back at the consumer's pace."""
    b, = bookies(1, metadata_uri=None)
    ledger, count, size = 7, 120, 1_000_000
    crcs = []
    async with await BookieClient.connect(b.address) as c:
        for k in range(0, count, 10):
            bodies = [entry.encode(ledger, e, e - 1, random.Random(e).randbytes(size)) for e in range(k, k + 10)]
            await asyncio.gather(*(c.add(ledger, k + i, body, master_key=KEY) for i, body in enumerate(bodies)))
            crcs += [(k + i, len(body), zlib.crc32(body)) for i, body in enumerate(bodies)]
    run = await read_tool(jar, b.address, ledger, 0, count - 1, "--sleep-ms", "100", "--report-memory",
                          jvm=("-Xmx64m", "-XX:MaxDirectMemorySize=64m"), timeout=300)
    assert run.code == 0 and run.last == "end", run.last + run.err[-2000:]
    assert run.entries == crcs
    assert len(run.answers) > 10   # many answers, each taken in turn
    # a stream window (4 MiB), the message being cut and two whole ones, in pooled chunks: ~17 MiB;
    # a stream that read on regardless held what the connection's window let in (64 MiB)
    assert 0 < run.memory < 28 << 20, run.memory


@pytest.mark.parametrize("answers_pings", [False, True])
async def test_a_silent_connection_is_pinged_and_dropped_if_the_ping_goes_unanswered(jar, answers_pings):
    """A bookie silent while a call waits is sent a PING after the keepalive time (1 s here): unanswered
    for as long again, the connection is closed and the call fails at once, long before its own
    timeout; answered (a live bookie whose call is slow), the call waits for its timeout."""
    raw = RawServer(answering(call(end=False)), answer_pings=answers_pings)
    address = await raw.start()
    timeout = 6000 if answers_pings else 60_000
    run = await read_tool(jar, address, 1, 0, 10, "--timeout-ms", str(timeout),
                          jvm=("-Dpybk.bookie.keepaliveSeconds=1",))
    assert run.code == 1 and run.status == TRANSPORT, run.last
    assert any(f[0] == h2frames.PING and not f[1] & h2frames.ACK for f in raw.frames)
    if answers_pings:
        assert f"bookie {address}: no answer within 6000 ms" in run.last
    else:
        assert f"bookie {address}: the connection or stream closed before the call ended" in run.last
        assert run.seconds < 30
