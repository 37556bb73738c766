"""Fixtures for the metadata tests: stores connected to the test's real etcd."""
from __future__ import annotations

import pytest

from pybk.meta import MetadataStore


@pytest.fixture
async def open_store(etcd):
    """Factory: `await open_store(**uri_options)` -> a MetadataStore on the test's etcd, closed after."""
    stores = []

    async def make(prefix: str = "pybk", **options) -> MetadataStore:
        query = "&".join(f"{k}={v}" for k, v in options.items())
        store = await MetadataStore.connect(etcd.metadata_uri(prefix) + (f"?{query}" if query else ""))
        stores.append(store)
        return store

    yield make
    for store in stores:
        await store.close()


@pytest.fixture
async def store(open_store) -> MetadataStore:
    return await open_store()
