"""Ledger ids allocated in the metadata for tests that write to bookies directly: a bookie that
reads the metadata accepts a ledger's first key only if the ledger exists there and the key
matches its key check, as for a ledger a writer created."""
from __future__ import annotations

from pybk import entry
from pybk.meta import MetadataStore


async def allocate(metadata_uri: str, ledger_ids, master_key: bytes, bookies: list[str] | None = None) -> None:
    """Store OPEN ledgers with these ids (one fragment on `bookies`, default a placeholder) whose
    key check matches `master_key`."""
    async with await MetadataStore.connect(metadata_uri) as store:
        for ledger_id in ledger_ids:
            await store.ledgers.create(bookies or ["127.0.0.1:1"], 1, 1, ledger_id=ledger_id,
                                       key_check=entry.key_check(master_key))
