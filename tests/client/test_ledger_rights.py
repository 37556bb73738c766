"""Who may write, fence and delete a ledger (real bookies, real etcd, security off): bookies accept
a ledger's first key only when the metadata allocates the ledger and the key matches it; keys
taken from the metadata write nothing; keyless recovery is an admin's; deletes need the password
or force as an admin."""
from __future__ import annotations

import pytest

from pybk import entry
from pybk.client.bookie_client import BookieClient, BookieError, Status
from pybk.client import BookKeeper
from pybk.client.bookkeeper import delete_refusal
from pybk.client.errors import NoSuchLedgerError, UnauthorizedError
from pybk.security.roles import Role

PASSWORD = b"owner-secret"


async def _clients(bk: BookKeeper, cluster) -> list[BookieClient]:
    return [await bk.client(b.bookie_id) for b in cluster.bookies]


async def test_an_unallocated_ledger_id_cannot_be_fenced_or_written_and_stays_free_for_its_owner(cluster_factory):
    cluster = cluster_factory(3)
    attacker_key = entry.master_key(b"attacker")
    async with await BookKeeper.connect(cluster.uri) as bk:
        first = await bk.create_ledger(ensemble=3, password=PASSWORD)
        await first.close()
        claimed = first.ledger_id + 1  # the id the owner's next ledger gets
        for client in await _clients(bk, cluster):
            with pytest.raises(BookieError) as err:
                await client.fence(claimed, attacker_key)
            assert err.value.code is Status.UNAUTHORIZED
            assert f"ledger {claimed} is not allocated in the metadata" in str(err.value)
            with pytest.raises(BookieError) as err:
                await client.add(claimed, 0, entry.encode(claimed, 0, -1, b"mine"), master_key=attacker_key)
            assert err.value.code is Status.UNAUTHORIZED and "not allocated" in str(err.value)
            assert claimed not in await client.list_ledgers()  # nothing recorded: no key, no fence

        lh = await bk.create_ledger(ensemble=3, password=PASSWORD)
        assert lh.ledger_id == claimed
        payloads = [b"owner-%d" % i for i in range(20)]
        for p in payloads:
            await lh.add_entry(p)
        await lh.close()
        rh = await bk.open_ledger(claimed, password=PASSWORD)
        assert [bytes(e.data) async for e in rh.read_entries(0, 19)] == payloads


async def test_an_add_with_a_key_taken_from_the_metadata_is_refused_and_entries_read_back_unchanged(cluster_factory):
    cluster = cluster_factory(4)
    async with await BookKeeper.connect(cluster.uri) as bk:
        lh = await bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2, password=PASSWORD)
        payloads = [b"balance=%d" % i for i in range(10)]
        for p in payloads:
            await lh.add_entry(p)
        lid = lh.ledger_id
        md = await bk.ledger_metadata(lid)
        assert md.master_key == b"" and md.key_check == entry.key_check(entry.master_key(PASSWORD))
        forged = entry.encode(lid, 0, -1, b"balance=999")
        # every bookie: those that hold the ledger (its key recorded) and the one that does not
        for client in await _clients(bk, cluster):
            for stolen in (md.key_check, md.password_hash):
                with pytest.raises(BookieError) as err:
                    await client.add(lid, 0, forged, master_key=stolen, recovery=True)
                assert err.value.code is Status.UNAUTHORIZED and f"master key for ledger {lid}" in str(err.value)
        await lh.close()
        rh = await bk.open_ledger(lid, password=PASSWORD)
        assert [bytes(e.data) async for e in rh.read_entries(0, 9)] == payloads


async def test_keyless_recovery_adds_and_fences_are_accepted_from_an_admin(cluster_factory):
    """Security off: every caller is an admin (Info says so), so the keyless requests autorecovery
    makes are accepted and record no key; the owner's key is still checked afterwards."""
    cluster = cluster_factory(1)
    async with await BookKeeper.connect(cluster.uri) as bk:
        lh = await bk.create_ledger(ensemble=1, password=PASSWORD)
        await lh.add_entry(b"first")
        client, = await _clients(bk, cluster)
        assert (await client.info())["caller_role"] == "admin"
        copy = entry.encode(lh.ledger_id, 1, 0, b"copied")
        await client.add(lh.ledger_id, 1, copy, master_key=b"", recovery=True)
        assert await client.fence(lh.ledger_id, b"") == 0
        with pytest.raises(BookieError) as err:
            await client.add(lh.ledger_id, 2, entry.encode(lh.ledger_id, 2, 1, b"x"), master_key=b"")
        assert err.value.code is Status.BAD_REQUEST and "keyless recovery" in str(err.value)
        with pytest.raises(BookieError) as err:
            await client.fence(lh.ledger_id, entry.master_key(b"other"))
        assert err.value.code is Status.UNAUTHORIZED
        assert await client.read(lh.ledger_id, 1) == copy


async def test_a_delete_needs_the_password_or_force_as_an_admin(cluster_factory):
    cluster = cluster_factory(3)
    async with await BookKeeper.connect(cluster.uri) as bk:
        kept = await bk.create_ledger(ensemble=3, password=PASSWORD)
        await kept.add_entry(b"kept")
        await kept.close()
        lid = kept.ledger_id
        for password in (None, b"wrong", entry.password_hash(PASSWORD)):
            with pytest.raises(UnauthorizedError) as err:
                await bk.delete_ledger(lid, password)
            assert f"ledger {lid}" in str(err.value)
        assert (await bk.ledger_metadata(lid)).ledger_id == lid
        await bk.delete_ledger(lid, PASSWORD)
        with pytest.raises(NoSuchLedgerError):
            await bk.ledger_metadata(lid)

        forced = await bk.create_ledger(ensemble=3, password=PASSWORD)
        await forced.close()
        await bk.delete_ledger(forced.ledger_id, force=True)  # security off: this client is an admin
        with pytest.raises(NoSuchLedgerError):
            await bk.ledger_metadata(forced.ledger_id)


def test_force_delete_is_refused_below_the_admin_role():
    digest = entry.password_hash(PASSWORD)
    for role in (Role.READER, Role.WRITER, None):
        why = delete_refusal(7, digest, None, True, role)
        assert why.startswith("deleting ledger 7 with force") and "needs the admin role" in why
        assert f"role {role if role is not None else 'unknown'}" in why
    assert delete_refusal(7, digest, None, True, Role.ADMIN) == ""
    assert delete_refusal(7, digest, PASSWORD, False, None) == ""
    assert delete_refusal(7, digest, b"guess", False, Role.ADMIN).startswith("wrong password for ledger 7")
    assert "needs its password" in delete_refusal(7, digest, None, False, Role.ADMIN)
