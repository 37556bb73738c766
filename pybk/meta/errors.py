"""The errors of the metadata layer; every one derives from MetadataError."""
from __future__ import annotations


class MetadataError(Exception):
    """Base class of every metadata error."""


class BadMetadataUriError(MetadataError, ValueError):
    """The metadata service URI is malformed; the message says which part is wrong."""


class MetadataUnavailableError(MetadataError):
    """etcd did not answer within the call's time bound; the message names the endpoint(s)."""

    def __init__(self, endpoints: str, detail: str):
        self.endpoints = endpoints
        super().__init__(f"etcd at {endpoints} is unreachable: {detail}")


class MetadataTlsError(MetadataUnavailableError):
    """The TLS handshake with etcd failed (wrong CA, refused client certificate, TLS to a plaintext
    port or the reverse); the message names the endpoint(s) and the cause. Retried like any
    unreachable etcd, since certificates can be fixed while a process waits."""

    def __init__(self, endpoints: str, detail: str):
        self.endpoints = endpoints
        MetadataError.__init__(self, f"TLS handshake with etcd at {endpoints} failed: {detail}")


class MetadataAuthError(MetadataError):
    """etcd refused who we are: wrong password or unknown user, or etcd requires authentication
    and none is configured. The message names the user (never the password)."""


class MetadataPermissionError(MetadataAuthError):
    """etcd knows the user but its roles do not allow the operation on that key."""


class NoClusterError(MetadataError):
    """etcd answers but holds no pybk cluster under the prefix (no cluster record): usually a wrong
    prefix in the metadata URI, or no bookie has ever started there."""


class NoSuchLedgerError(MetadataError, KeyError):
    """The ledger has no metadata (never created, or deleted)."""

    def __init__(self, ledger_id: int):
        self.ledger_id = ledger_id
        super().__init__(f"no such ledger: {ledger_id}")

    def __str__(self) -> str:
        return self.args[0]


class LedgerExistsError(MetadataError):
    """A ledger with this id already exists."""

    def __init__(self, ledger_id: int):
        self.ledger_id = ledger_id
        super().__init__(f"ledger {ledger_id} already exists")


class VersionConflictError(MetadataError):
    """A compare-and-swap lost: someone changed the value since it was read.

    `current` holds the value as it is now (re-read in the same etcd transaction) when
    the caller's kind of value supports it, else None.
    """

    def __init__(self, what: str, expected_version: int, current=None, current_version: int | None = None):
        self.expected_version = expected_version
        self.current = current
        self.current_version = current_version
        now = "it no longer exists" if current_version is None else f"it is now at version {current_version}"
        super().__init__(f"version conflict on {what}: expected version {expected_version}, {now}")


class BadMetadataError(MetadataError):
    """A stored value cannot be decoded, or a value to store is invalid."""


class BookieIdInUseError(MetadataError):
    """Another live process holds the registration of this bookie id."""


class CookieMismatchError(MetadataError):
    """A bookie's cookie in etcd and in its directories disagree; the message says what and how to fix it."""


class SessionClosedError(MetadataError):
    """The metadata session has been closed."""


class LockLostError(MetadataError):
    """A lock or leadership was lost because the session's lease expired."""


class WatchCompactedError(MetadataError):
    """A watch cannot resume: etcd compacted the history it needs."""

    def __init__(self, compact_revision: int):
        self.compact_revision = compact_revision
        super().__init__(f"watch cannot resume: etcd history compacted up to revision {compact_revision}")
