"""Fixtures for the metadata tests: stores connected to the test's real etcd, and a real etcd
with TLS and authentication on."""
from __future__ import annotations

import pytest
from secure_etcd import SecureEtcd, start_secure_etcd

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



@pytest.fixture
async def secure_etcd_factory(tmp_path, child_processes):
    """Factory: `await secure_etcd_factory(client_cert_auth=False, auth_token_ttl=None)` -> a
    SecureEtcd (tests/meta/secure_etcd.py), a fresh one per call, stopped after the test."""
    started = []

    async def make(**options) -> SecureEtcd:
        secure = await start_secure_etcd(tmp_path / f"secure-etcd-{len(started)}", **options)
        started.append(secure)
        return secure

    yield make
    for secure in started:
        secure.proc.stop()


@pytest.fixture
async def secure_etcd(secure_etcd_factory) -> SecureEtcd:
    return await secure_etcd_factory()
