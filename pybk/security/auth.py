"""Who is calling a server, from the auth file (docs/security.md): bearer tokens (by SHA-256, or
a token file) and client certificates (by common name), each mapped to a role.

`Authenticator.authorize` decides for one call: the caller's Principal when its role allows the
operation, else `AccessDenied` (UNAUTHENTICATED for no or an unknown credential, PERMISSION_DENIED
naming the role needed). Without an auth file every caller is `roles.OPEN`. The file (and the token
files it names) is re-read when it changes; a replacement that does not parse is logged and the
previous table stays. Tokens are compared by hash, in constant time.
"""
from __future__ import annotations

import enum
import hashlib
import hmac
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml

from .files import file_stamps
from .roles import OPEN, REQUIRED, Operation, Principal, Role

__all__ = ["AccessDenied", "AuthFileError", "AuthTable", "Authenticator", "Denial", "bearer_token",
           "parse_auth_file", "RELOAD_CHECK_SECONDS"]

log = logging.getLogger("pybk.security.auth")

RELOAD_CHECK_SECONDS = 1.0  # how often, at most, the auth file's modification time is looked at
BEARER = "bearer "


class AuthFileError(ValueError):
    """The auth file cannot be used; the first line names the file and what is wrong."""


class Denial(enum.Enum):
    """Why a call is refused: the caller is not known, or its role is too low."""

    UNAUTHENTICATED = "unauthenticated"
    PERMISSION_DENIED = "permission_denied"


class AccessDenied(Exception):
    """A call refused by authorization; the message names the cause (and the role needed)."""

    def __init__(self, denial: Denial, message: str):
        self.denial = denial
        self.message = message
        super().__init__(message)


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


@dataclass(frozen=True)
class AuthTable:
    """The parsed auth file: token digests and certificate common names, each with a Principal."""

    tokens: tuple[tuple[bytes, Principal], ...] = ()
    subjects: Mapping[str, Principal] = field(default_factory=dict)
    files: tuple[str, ...] = ()  # token files it read (watched for changes too)

    def by_token(self, token: str) -> Principal | None:
        """The principal of a token: every entry is compared (constant time per entry)."""
        digest = _digest(token)
        found = None
        for known, principal in self.tokens:
            if hmac.compare_digest(known, digest) and found is None:
                found = principal
        return found

    def by_subject(self, common_name: str) -> Principal | None:
        return self.subjects.get(common_name)


def _entries(doc: Mapping[str, Any], key: str, path: str) -> list[Mapping[str, Any]]:
    items = doc.get(key) or []
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise AuthFileError(f"{path}: `{key}` must be a list of mappings")
    return items


def _role(item: Mapping[str, Any], path: str, where: str) -> Role:
    try:
        return Role.parse(str(item.get("role", "")))
    except ValueError as exc:
        raise AuthFileError(f"{path}: {where}: {exc}") from None


def parse_auth_file(path: str) -> AuthTable:
    """Read and check an auth file; AuthFileError naming the file and the problem."""
    try:
        doc = yaml.safe_load(Path(path).read_text()) or {}
    except OSError as exc:
        raise AuthFileError(f"{path}: unreadable auth file: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise AuthFileError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(doc, dict):
        raise AuthFileError(f"{path}: must be a mapping with `tokens` and/or `subjects`")
    unknown = set(doc) - {"tokens", "subjects"}
    if unknown:
        raise AuthFileError(f"{path}: unknown keys {sorted(unknown)}; expected `tokens` and `subjects`")
    tokens: list[tuple[bytes, Principal]] = []
    files: list[str] = []
    for i, item in enumerate(_entries(doc, "tokens", path)):
        name = str(item.get("name") or f"token #{i + 1}")
        role = _role(item, path, f"token {name!r}")
        if item.get("sha256"):
            try:
                digest = bytes.fromhex(str(item["sha256"]).strip())
            except ValueError:
                digest = b""
            if len(digest) != 32:
                raise AuthFileError(f"{path}: token {name!r}: sha256 must be 64 hex digits")
        elif item.get("token_file"):
            token_file = str(item["token_file"])
            try:
                token = Path(token_file).read_text().strip()
            except OSError as exc:
                raise AuthFileError(f"{path}: token {name!r}: unreadable token_file {token_file}: "
                                    f"{exc.strerror or exc}") from None
            if not token:
                raise AuthFileError(f"{path}: token {name!r}: token_file {token_file} is empty")
            digest = _digest(token)
            files.append(token_file)
        else:
            raise AuthFileError(f"{path}: token {name!r}: give `sha256` or `token_file`")
        tokens.append((digest, Principal(name, role)))
    subjects: dict[str, Principal] = {}
    for item in _entries(doc, "subjects", path):
        cn = str(item.get("cn") or "")
        if not cn:
            raise AuthFileError(f"{path}: every subject needs a `cn` (certificate common name)")
        subjects[cn] = Principal(f"CN={cn}", _role(item, path, f"subject {cn!r}"))
    return AuthTable(tuple(tokens), subjects, tuple(files))


def bearer_token(values: Iterable[str]) -> str | None:
    """The token of the first `Bearer <token>` among authorization values, or None."""
    for value in values:
        if value[:len(BEARER)].lower() == BEARER:
            token = value[len(BEARER):].strip()
            if token:
                return token
    return None


def decide(table: AuthTable, token: str | None, common_name: str | None, operation: Operation) -> Principal:
    """The caller's Principal if it may perform `operation`; AccessDenied otherwise. A presented
    token must be known (no fallback to the certificate); else a verified certificate's CN counts."""
    if token is not None:
        principal = table.by_token(token)
        if principal is None:
            raise AccessDenied(Denial.UNAUTHENTICATED, "unknown bearer token")
    elif common_name:
        principal = table.by_subject(common_name)
        if principal is None:
            raise AccessDenied(Denial.UNAUTHENTICATED,
                               f"client certificate CN={common_name} is not listed in the auth file")
    else:
        raise AccessDenied(Denial.UNAUTHENTICATED, "no credential: present a bearer token "
                           "(authorization: Bearer ...) or a client certificate")
    if not principal.may(operation):
        raise AccessDenied(Denial.PERMISSION_DENIED,
                           f"{principal.name} has role {principal.role}; {operation.value} needs role "
                           f"{REQUIRED[operation]}")
    return principal


def _grpc_credential(context) -> tuple[str | None, str | None]:
    """(bearer token, certificate common name) of a gRPC call: the token of its `authorization`
    metadata, else the common name of the peer's verified certificate."""
    token = bearer_token(v for k, v in (context.invocation_metadata() or ()) if k == "authorization")
    names = context.auth_context().get("x509_common_name") if token is None else None
    return token, names[0].decode() if names else None


class Authenticator:
    """A server's authorization: the auth file's table, reloaded when the file changes. With no
    file every caller is OPEN."""

    def __init__(self, path: str | None):
        self.path = path
        self._table = parse_auth_file(path) if path else None
        self._internal: tuple[tuple[bytes, Principal], ...] = ()
        self._stamp = self._stamps() if path else None
        self._refused: tuple | None = None
        self._checked = time.monotonic()
        self._lock = threading.Lock()

    def add_internal_token(self, token: str, principal: Principal) -> None:
        """Also accept `token` as `principal`, whatever the auth file says: a process's own calls
        to itself (the bookie's readiness probe) with a random token that never leaves memory."""
        self._internal += ((_digest(token), principal),)
        if self._table is not None:
            self._table = AuthTable(self._table.tokens + self._internal, self._table.subjects, self._table.files)

    @property
    def enabled(self) -> bool:
        """Whether callers must authenticate (an auth file is configured)."""
        return self._table is not None

    def _stamps(self) -> tuple:
        return file_stamps((self.path, *(self._table.files if self._table else ())))

    def table(self) -> AuthTable | None:
        """The current table, re-read first if the file (or a token file) changed."""
        if self._table is None:
            return None
        now = time.monotonic()
        if now - self._checked >= RELOAD_CHECK_SECONDS:
            with self._lock:
                self._checked = now
                stamp = self._stamps()
                if stamp != self._stamp and stamp != self._refused:
                    try:
                        table = parse_auth_file(self.path)
                        table = AuthTable(table.tokens + self._internal, table.subjects, table.files)
                    except AuthFileError as exc:
                        self._refused = stamp
                        log.error("auth file changed but cannot be used, keeping the previous one: %s", exc)
                    else:
                        self._table, self._refused = table, None
                        self._stamp = self._stamps()
                        log.info("auth file %s reloaded: %d tokens, %d subjects", self.path,
                                 len(table.tokens), len(table.subjects))
        return self._table

    def authorize(self, token: str | None, common_name: str | None, operation: Operation) -> Principal:
        """The caller's Principal for `operation`, or AccessDenied; OPEN when auth is off."""
        table = self.table()
        if table is None:
            return OPEN
        return decide(table, token, common_name, operation)

    def authorize_grpc(self, context, operation: Operation) -> Principal:
        """For a gRPC call: the bearer token of its `authorization` metadata, or the common name of
        the peer's verified certificate."""
        if self._table is None:
            return OPEN
        return self.authorize(*_grpc_credential(context), operation)

    def knows_grpc(self, context) -> bool:
        """Whether a gRPC call carries a credential of the auth file (a known bearer token, or a
        verified certificate whose common name is listed), whatever its role; True with no file."""
        table = self.table()
        if table is None:
            return True
        token, common_name = _grpc_credential(context)
        if token is not None:
            return table.by_token(token) is not None
        return common_name is not None and table.by_subject(common_name) is not None

    def authorize_http(self, request, operation: Operation) -> Principal:
        """For an aiohttp request: its `Authorization: Bearer` header, or the common name of the
        client certificate the TLS handshake verified."""
        if self._table is None:
            return OPEN
        token = bearer_token(request.headers.getall("Authorization", []))
        common_name = None
        if token is None and request.transport is not None:
            common_name = certificate_common_name(request.transport.get_extra_info("peercert"))
        return self.authorize(token, common_name, operation)


def certificate_common_name(cert: dict | None) -> str | None:
    """The subject common name of a peer certificate as `ssl` gives it (`getpeercert()`: verified
    by the handshake), None without a certificate or a common name."""
    names = [value for rdn in (cert or {}).get("subject", ()) for key, value in rdn if key == "commonName"]
    return names[-1] if names else None
