"""Checks shared by the autorecovery tests (imported by name: tests/ has no packages)."""
from __future__ import annotations

from pybk import entry
from pybk.client.bookie_client import BookieClient
from pybk.ledger import entry_ranges

from polling import eventually  # noqa: F401 - the recovery tests import it from here

PASSWORD = b"recovery-test-pw"

async def held_by_bookie(addresses: dict[str, str], ledger_ids) -> dict[str, dict[int, set[int]]]:
    """bookie id -> ledger id -> entry ids it holds (ListEntries), for live bookies."""
    out: dict[str, dict[int, set[int]]] = {}
    for bid, address in addresses.items():
        c = await BookieClient.connect(address)
        try:
            per: dict[int, set[int]] = {}
            for lid in ledger_ids:
                ids: set[int] = set()
                for a, b in await c.list_entries(lid):
                    ids.update(range(a, b + 1))
                per[lid] = ids
            out[bid] = per
        finally:
            await c.close()
    return out


async def every_copy_written(store, addresses: dict[str, str], written: dict[int, list[bytes]]) -> bool:
    """Whether every written entry is on every bookie of its write set. An add is acknowledged by
    the ack quorum; a test that closes its client at once may drop the last copy still on its
    way, leaving a ledger under-replicated that no lost bookie explains."""
    held = await held_by_bookie(addresses, written)
    for lid, payloads in written.items():
        md = await store.ledgers.get(lid)
        for e in range(len(payloads)):
            if any(e not in held[b][lid] for b in md.write_set(e) if b in held):
                return False
    return True


async def assert_fully_replicated(store, addresses: dict[str, str], written: dict[int, list[bytes]],
                                  password: bytes = PASSWORD) -> None:
    """Every written entry is held by exactly its write set (ListEntries of every live bookie),
    every copy is byte-identical to what was written, no ledger references a dead bookie, and
    closed ledgers kept every acked entry."""
    held = await held_by_bookie(addresses, written)
    for lid, payloads in written.items():
        md = await store.ledgers.get(lid)
        if md.is_closed:
            assert md.last_entry_id >= len(payloads) - 1, f"ledger {lid} lost acked entries: last {md.last_entry_id}"
            last = md.last_entry_id
        else:  # an open ledger autorecovery had no reason to touch: its acked entries
            last = len(payloads) - 1
        assert md.bookies() <= set(addresses), f"ledger {lid} references dead bookies {md.bookies() - set(addresses)}"
        for e in range(last + 1):
            want = set(md.write_set(e))
            have = {b for b in addresses if e in held[b][lid]}
            assert have == want, f"ledger {lid} entry {e}: held by {sorted(have)}, write set {sorted(want)}"
    for bid, address in addresses.items():
        c = await BookieClient.connect(address)
        try:
            for lid, payloads in written.items():
                ids = sorted(e for e in held[bid][lid] if e < len(payloads))
                if not ids:
                    continue
                md = await store.ledgers.get(lid)
                got = 0
                for a, b in entry_ranges(ids):
                    async for e, body in c.read_range(lid, a, b):
                        _, payload = entry.decode(body, md.digest_type, password, ledger_id=lid, entry_id=e)
                        assert payload == payloads[e], f"ledger {lid} entry {e} on {bid} differs"
                        got += 1
                assert got == len(ids)
        finally:
            await c.close()
