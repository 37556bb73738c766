"""MetadataStore: one etcd connection and session, and every kind of metadata on them."""
from __future__ import annotations

import dataclasses

from . import uri as uri_mod
from .cluster import Cluster
from .cookies import Cookies
from .errors import MetadataError
from .etcd import Etcd
from .ledgers import Ledgers
from .registry import Registry
from .session import Session


class MetadataStore:
    """`store = await MetadataStore.connect("etcd://host:port/prefix")`; `await store.close()`."""

    def __init__(self, uri: uri_mod.MetadataUri, id_block: int = 1000):
        from .decommission import Decommissions
        from .election import Elections
        from .jobs import Jobs
        from .locks import Locks
        from .underreplication import UnderReplication

        self.uri = uri
        self.etcd = Etcd(uri)
        self.prefix = uri.key_prefix
        self.session = Session(self.etcd, uri.lease_ttl)
        self.ledgers = Ledgers(self.etcd, self.prefix, id_block)
        self.registry = Registry(self.etcd, self.prefix, self.session)
        self.cluster = Cluster(self.etcd, self.prefix)
        self.cookies = Cookies(self.etcd, self.prefix)
        self.underreplication = UnderReplication(self.etcd, self.prefix)
        self.locks = Locks(self.etcd, self.prefix + b"locks/", self.session)
        self.election = Elections(self.etcd, self.prefix, self.session)
        self.decommission = Decommissions(self.etcd, self.prefix)
        self.jobs = Jobs(self.etcd, self.prefix)

    @classmethod
    async def connect(cls, uri: str | uri_mod.MetadataUri, *, check: bool = True, id_block: int = 1000,
                      lease_ttl: int | None = None, timeout: float | None = None) -> "MetadataStore":
        """Parse the URI and open the store; with check, fail now (MetadataUnavailableError) if
        etcd does not answer within the call timeout. lease_ttl / timeout, when given, override
        the URI's options (`?lease_ttl=`, `?timeout=`)."""
        parsed = uri if isinstance(uri, uri_mod.MetadataUri) else uri_mod.parse(uri)
        if lease_ttl is not None or timeout is not None:
            if (lease_ttl is not None and lease_ttl <= 0) or (timeout is not None and timeout <= 0):
                raise uri_mod.BadMetadataUriError("lease_ttl and timeout must be positive")
            parsed = dataclasses.replace(parsed, lease_ttl=lease_ttl or parsed.lease_ttl,
                                         timeout=timeout or parsed.timeout)
        store = cls(parsed, id_block)
        if check:
            try:
                await store.cluster.get()
            except MetadataError:
                await store.etcd.close()
                raise
        return store

    async def close(self) -> None:
        """Revoke the session lease (unregistering this process's bookies, releasing its locks
        and leaderships at once) and close the connection."""
        await self.session.close()
        await self.etcd.close()

    async def __aenter__(self) -> "MetadataStore":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
