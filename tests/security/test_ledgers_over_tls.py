"""The ledger client on secured bookies: a full write and read with TLS and tokens; a credential
the bookies refuse is an AccessDeniedError, never a failed bookie (no ensemble change, nothing
stored); and what a bookie says at start about its security."""
from __future__ import annotations

import pytest
from polling import eventually

from pybk.client import AccessDeniedError, BookKeeper, NoSuchLedgerError, UnauthorizedError
from pybk.security.settings import ClientSecurity


async def test_ledger_write_and_read_through_bookkeeper_with_tls_and_tokens(bookies, pki, metadata_uri):
    bookies(3, **pki.bookie_options())
    payloads = [f"entry {i}".encode() * (i % 7 + 1) for i in range(200)]
    async with await BookKeeper.connect(metadata_uri, security=pki.client("writer")) as bk:
        lh = await bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2, password=b"pw")
        for p in payloads:
            await lh.add_entry(p)
        await lh.close()
        ledger_id = lh.ledger_id
    async with await BookKeeper.connect(metadata_uri, security=pki.client("reader")) as bk:
        rh = await bk.open_ledger(ledger_id, password=b"pw")
        got = [e.data async for e in rh.read_entries(0, len(payloads) - 1)]
    assert got == payloads


async def test_bookkeeper_takes_its_credentials_from_the_environment(bookies, pki, metadata_uri, monkeypatch):
    bookies(1, **pki.bookie_options())
    for name, value in pki.client("writer").as_env().items():
        monkeypatch.setenv(name, value)
    assert ClientSecurity.from_env() == pki.client("writer")
    async with await BookKeeper.connect(metadata_uri) as bk:
        lh = await bk.create_ledger(ensemble=1, password=b"pw")
        assert await lh.add_entry(b"from the environment") == 0
        assert [e.data async for e in lh.read_entries(0, 0)] == [b"from the environment"]


async def test_refused_writer_gets_access_denied_without_ensemble_change(bookies, pki, metadata_uri):
    procs = bookies(4, **pki.bookie_options())
    async with await BookKeeper.connect(metadata_uri, security=pki.client("reader")) as bk:
        lh = await bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2, password=b"pw")
        ensemble = list(lh.metadata.fragments[-1].bookies)
        with pytest.raises(AccessDeniedError) as err:
            await lh.add_entry(b"balance=999")
        assert any(b in str(err.value) for b in ensemble)
        assert "reader-client has role reader; add needs role writer" in str(err.value)
        md = await bk.ledger_metadata(lh.ledger_id)
    assert len(md.fragments) == 1 and list(md.fragments[0].bookies) == ensemble
    async with await BookKeeper.connect(metadata_uri, security=pki.client("admin")) as bk:
        for b in procs:
            client = await bk.client(b.bookie_id)
            assert await client.list_entries(lh.ledger_id) == []


async def test_bookie_without_auth_file_says_security_is_off(bookies):
    b, = bookies(1, metadata_uri=None)
    line = (f"WARNING pybk.bookie: security is OFF: no --auth-file, so any client that reaches {b.address} "
            f"may read, write and administer")
    await eventually(lambda: line in b.log_tail(30), timeout=10, what="the security warning")


async def test_bookie_with_tokens_over_plaintext_warns(bookies, pki):
    b, = bookies(1, metadata_uri=None, auth_file=pki.auth_file)
    await eventually(lambda: "WARNING pybk.bookie: bearer tokens travel in plaintext" in b.log_tail(30),
                     timeout=10, what="the plaintext token warning")
    assert "security is OFF" not in b.log_tail(30)


async def test_writer_replaces_a_lost_bookie_with_security_on(bookies, pki, metadata_uri):
    procs = bookies(4, **pki.bookie_options())
    payloads = [f"entry {i}".encode() for i in range(100)]
    async with await BookKeeper.connect(metadata_uri, security=pki.client("writer")) as bk:
        lh = await bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2, password=b"pw")
        for p in payloads[:50]:
            await lh.add_entry(p)
        lost = lh.metadata.fragments[-1].bookies[0]
        next(b for b in procs if b.bookie_id == lost).kill()
        for p in payloads[50:]:
            await lh.add_entry(p)
        await lh.close()
        md = await bk.ledger_metadata(lh.ledger_id)
    assert len(md.fragments) == 2 and lost not in md.fragments[-1].bookies
    async with await BookKeeper.connect(metadata_uri, security=pki.client("reader")) as bk:
        rh = await bk.open_ledger(lh.ledger_id, password=b"pw")
        assert [e.data async for e in rh.read_entries(0, 99)] == payloads


async def test_a_crashed_writers_ledger_is_recovered_by_a_writer_with_its_password(bookies, pki, metadata_uri):
    bookies(3, **pki.bookie_options())
    payloads = [f"acked {i}".encode() for i in range(30)]
    crashed = await BookKeeper.connect(metadata_uri, security=pki.client("writer"))
    lh = await crashed.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2, password=b"pw")
    for p in payloads:
        await lh.add_entry(p)
    await crashed.close()  # the ledger stays OPEN, as after a crash
    async with await BookKeeper.connect(metadata_uri, security=pki.client("writer")) as bk:
        rh = await bk.open_ledger(lh.ledger_id, password=b"pw")
        assert rh.metadata.is_closed and rh.metadata.last_entry_id == len(payloads) - 1
        assert [e.data async for e in rh.read_entries(0, len(payloads) - 1)] == payloads


async def test_deleting_needs_the_password_or_an_admin_credential(bookies, pki, metadata_uri):
    bookies(1, **pki.bookie_options())
    async with await BookKeeper.connect(metadata_uri, security=pki.client("writer")) as bk:
        lh = await bk.create_ledger(ensemble=1, password=b"pw")
        await lh.add_entry(b"keep me")
        await lh.close()
        with pytest.raises(UnauthorizedError, match="needs the admin role; bookies take this client for role writer"):
            await bk.delete_ledger(lh.ledger_id, force=True)
        with pytest.raises(UnauthorizedError, match=f"wrong password for ledger {lh.ledger_id}"):
            await bk.delete_ledger(lh.ledger_id, password=b"guess")
        assert (await bk.ledger_metadata(lh.ledger_id)).ledger_id == lh.ledger_id
    async with await BookKeeper.connect(metadata_uri, security=pki.client("admin")) as bk:
        await bk.delete_ledger(lh.ledger_id, force=True)
        with pytest.raises(NoSuchLedgerError):
            await bk.ledger_metadata(lh.ledger_id)


async def test_with_security_on_a_ledger_without_a_password_is_refused(bookies, pki, metadata_uri):
    """Its master key would be the empty password's, which anyone can compute: a secured client
    refuses to create it (nothing is allocated), and creates it with a password."""
    from pybk.client import InsecureLedgerError
    from pybk.meta import MetadataStore
    bookies(1, **pki.bookie_options())
    async with await BookKeeper.connect(metadata_uri, security=pki.client("writer")) as bk:
        for password in (None, b""):
            with pytest.raises(InsecureLedgerError) as refused:
                await bk.create_ledger(ensemble=1, password=password)
            first = str(refused.value).splitlines()[0]
            assert first.startswith("refusing to create a ledger without a password: with security on, its master "
                                    "key would be the empty password's, which anyone can compute")
        async with await MetadataStore.connect(metadata_uri) as store:
            assert [md.ledger_id async for md in store.ledgers.list_metadata()] == []
        lh = await bk.create_ledger(ensemble=1, password=b"a long random secret")
        assert await lh.add_entry(b"kept") == 0
        await lh.close()
