"""Metadata on etcd: ledger metadata with CAS, id allocation, bookie registry, cookies, markers, election.

    store = await MetadataStore.connect("etcd://host:port[,host:port]/prefix[?timeout=5&lease_ttl=10]")
    (TLS and etcd users: `?tls_ca=...&user=...&password_file=...`, see pybk.meta.uri)
    store.ledgers           create / get / cas / update / delete / list / pages / list_metadata / count / watch
    store.registry          register / set_readonly / unregister / writable / readonly / all / get / watch
    store.cluster           instance_id()
    store.cookies           get / create / update / delete / list / verify (the bookie start-up check)
    store.underreplication  mark / get / unmark / list / count / watch
    store.locks             acquire / try_acquire / holder          (on the session lease)
    store.election          campaign / try_lead / leader / observe  (on the session lease)
    store.decommission      request / get / update / remove / list / watch
    store.session           lease_id() / lost (asyncio.Event) / on_new_lease / on_lost
    await store.close()     revokes the lease: registrations, locks, leaderships go at once

Every call is bounded by the URI's timeout and raises MetadataUnavailableError naming the
endpoints when etcd does not answer; the connection and the session recover by themselves.
"""
from .cookies import Cookie
from .errors import (BadMetadataError, BadMetadataUriError, BookieIdInUseError, CookieMismatchError,
                     LedgerExistsError, LockLostError, MetadataAuthError, MetadataError, MetadataPermissionError,
                     MetadataTlsError, MetadataUnavailableError, NoSuchLedgerError, SessionClosedError,
                     VersionConflictError, WatchCompactedError)
from .ledgers import Fragment, LedgerMetadata, LedgerState
from .registry import BookieEvent, BookieInfo
from .store import MetadataStore
from .uri import MetadataUri, parse as parse_uri

__all__ = [
    "BadMetadataError", "BadMetadataUriError", "BookieEvent", "BookieIdInUseError", "BookieInfo", "Cookie",
    "CookieMismatchError", "Fragment", "LedgerExistsError", "LedgerMetadata", "LedgerState", "LockLostError",
    "MetadataAuthError", "MetadataError", "MetadataPermissionError", "MetadataStore", "MetadataTlsError",
    "MetadataUnavailableError", "MetadataUri", "NoSuchLedgerError", "SessionClosedError",
    "VersionConflictError", "WatchCompactedError", "parse_uri",
]
