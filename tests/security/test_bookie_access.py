"""Who may do what on a bookie with TLS and an auth file: real `pybk bookie` processes, a client
per role (docs/security.md), every refusal checked by its code and the cause it names, and the
stored entries checked unchanged after every refused write."""
from __future__ import annotations

import asyncio

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pybk import entry
from pybk.client.bookie_client import BookieAccessDeniedError, BookieClient, BookieUnavailableError, Status
from pybk.security.settings import ClientSecurity

KEY = entry.master_key(b"pw")
LEDGER = 7


def body(eid: int, text: bytes = b"balance=100") -> bytes:
    return entry.encode(LEDGER, eid, eid - 1, text)


async def write_entries(bookie, pki, count: int = 5) -> list[tuple[int, bytes]]:
    """Entries 0..count-1 of LEDGER added by a writer; what a reader must find afterwards."""
    async with await BookieClient.connect(bookie.address, security=pki.client("writer")) as c:
        await asyncio.gather(*(c.add(LEDGER, i, body(i), master_key=KEY) for i in range(count)))
    return [(i, body(i)) for i in range(count)]


async def stored(bookie, pki) -> tuple[list[tuple[int, bytes]], int]:
    """(entries, LAC) of LEDGER as an admin reads them."""
    async with await BookieClient.connect(bookie.address, security=pki.client("admin")) as c:
        entries = []
        for first, last in await c.list_entries(LEDGER):
            entries += [(e, b) async for e, b in c.read_range(LEDGER, first, last)]
        return entries, await c.read_lac(LEDGER)


async def test_plaintext_client_cannot_talk_to_a_tls_bookie(bookies, pki):
    b, = bookies(1, metadata_uri=None, **pki.bookie_options())
    async with await BookieClient.connect(b.address, security=pki.client("admin", tls=False)) as c:
        with pytest.raises(BookieUnavailableError) as err:
            await c.info()
    assert err.value.address == b.address
    assert "UNAVAILABLE" in str(err.value) and "if the bookie serves TLS" in str(err.value)


async def test_a_plaintext_add_to_a_tls_bookie_fails_naming_tls(bookies, pki):
    """The Add stream has a connection of its own: a TLS port closes it at once, and the add's
    error says to look at TLS, like the other calls'."""
    b, = bookies(1, metadata_uri=None, **pki.bookie_options())
    async with await BookieClient.connect(b.address, security=pki.client("admin", tls=False)) as c:
        with pytest.raises(BookieUnavailableError) as err:
            await asyncio.wait_for(c.add(LEDGER, 0, body(0), master_key=KEY), 30)
    assert err.value.address == b.address
    assert "UNAVAILABLE" in str(err.value) and "if the bookie serves TLS" in str(err.value)


@pytest.mark.parametrize("call", ["read", "read_lac", "list_entries", "info", "list_ledgers"])
async def test_client_without_credentials_is_refused_reads(bookies, pki, call):
    b, = bookies(1, metadata_uri=None, **pki.bookie_options())
    await write_entries(b, pki)
    calls = {"read": lambda c: c.read(LEDGER, 0), "read_lac": lambda c: c.read_lac(LEDGER),
             "list_entries": lambda c: c.list_entries(LEDGER), "info": lambda c: c.info(),
             "list_ledgers": lambda c: c.list_ledgers()}
    async with await BookieClient.connect(b.address, security=pki.client(None)) as c:
        with pytest.raises(BookieAccessDeniedError) as err:
            await calls[call](c)
    assert err.value.code is Status.ACCESS_DENIED
    assert err.value.grpc_code is grpc.StatusCode.UNAUTHENTICATED
    assert "no credential" in err.value.message and err.value.address == b.address


async def test_unknown_token_is_unauthenticated(bookies, pki, tmp_path):
    b, = bookies(1, metadata_uri=None, **pki.bookie_options())
    forged = tmp_path / "forged.token"
    forged.write_text("not-a-token-of-this-cluster")
    security = ClientSecurity(tls_ca=str(pki.server.ca), token_file=str(forged))
    async with await BookieClient.connect(b.address, security=security) as c:
        with pytest.raises(BookieAccessDeniedError) as err:
            await c.read_lac(LEDGER)
    assert err.value.grpc_code is grpc.StatusCode.UNAUTHENTICATED and "unknown bearer token" in err.value.message
    status, page = await asyncio.to_thread(b.http_get, "/metrics")
    assert status == 200
    denied = {tuple(sorted(s.labels.items())): s.value for f in text_string_to_metric_families(page.decode())
              for s in f.samples if s.name == "pybk_bookie_denied_requests_total"}
    assert denied == {(("code", "UNAUTHENTICATED"), ("operation", "read")): 1.0}


async def test_reader_reads_but_cannot_add_fence_or_write_lac(bookies, pki):
    b, = bookies(1, metadata_uri=None, **pki.bookie_options())
    written = await write_entries(b, pki)
    async with await BookieClient.connect(b.address, security=pki.client("reader")) as c:
        assert [(e, bd) async for e, bd in c.read_range(LEDGER, 0, 4)] == written
        assert await c.read_lac(LEDGER) == 3
        attempts = {"add": c.add(LEDGER, 2, body(2, b"balance=999"), master_key=KEY, recovery=True),
                    "fence": c.fence(LEDGER, KEY), "write_lac": c.write_lac(LEDGER, 4, KEY)}
        for operation, attempt in attempts.items():
            with pytest.raises(BookieAccessDeniedError) as err:
                await attempt
            assert err.value.grpc_code is grpc.StatusCode.PERMISSION_DENIED, operation
            assert f"{operation} needs role writer" in err.value.message, err.value.message
    assert await stored(b, pki) == (written, 3)
    # not fenced: the writer still adds
    async with await BookieClient.connect(b.address, security=pki.client("writer")) as c:
        await c.add(LEDGER, 5, body(5), master_key=KEY)


async def test_writer_adds_fences_and_writes_lac(bookies, pki):
    b, = bookies(1, metadata_uri=None, **pki.bookie_options())
    written = await write_entries(b, pki)
    async with await BookieClient.connect(b.address, security=pki.client("writer")) as c:
        await c.write_lac(LEDGER, 4, KEY)
        assert await c.fence(LEDGER, KEY) == 4
    assert await stored(b, pki) == (written, 4)


async def test_info_tells_the_caller_who_the_bookie_takes_it_for(bookies, pki):
    secured, = bookies(1, metadata_uri=None, **pki.bookie_options())
    for role in ("reader", "writer", "admin"):
        async with await BookieClient.connect(secured.address, security=pki.client(role)) as c:
            info = await c.info()
        assert (info["caller"], info["caller_role"]) == (f"{role}-client", role)
    open_bookie, = bookies(1, metadata_uri=None)
    async with await BookieClient.connect(open_bookie.address) as c:
        info = await c.info()
    assert info["caller_role"] == "admin" and "security off" in info["caller"]


async def test_a_tls_connection_must_finish_its_handshake_and_preface_in_time(bookies, pki):
    """handshake_timeout 1 s counts from the TCP connection: a client that never says hello, and
    one that finishes TLS but never sends the HTTP/2 preface, are both dropped; a client that
    speaks is served."""
    import socket
    import ssl
    import h2frames
    from pybk.security.tls import client_ssl_context
    b, = bookies(1, metadata_uri=None, handshake_timeout=1, **pki.bookie_options())
    loop = asyncio.get_running_loop()
    mute = socket.create_connection(("127.0.0.1", b.port))
    context = client_ssl_context(pki.client())
    context.set_alpn_protocols(["h2"])
    reader, writer = await asyncio.open_connection("127.0.0.1", b.port, ssl=context, server_hostname="127.0.0.1")
    try:
        got = await asyncio.wait_for(reader.read(), 15)  # TLS up, no preface: dropped after the SETTINGS
        assert reader.at_eof() and got[3] == h2frames.SETTINGS
        mute.settimeout(15)
        assert await loop.run_in_executor(None, mute.recv, 1) == b""  # never a ClientHello: dropped
        async with await BookieClient.connect(b.address, security=pki.client("reader")) as c:
            assert (await c.info())["caller_role"] == "reader"
        status, page = b.http_get("/metrics")
        assert 'pybk_bookie_connections_closed_total{reason="handshake_timeout"} 2.0' in page.decode()
    except (ConnectionResetError, ssl.SSLError):
        raise AssertionError("a dropped connection should end, not fail")
    finally:
        mute.close()
        writer.close()
