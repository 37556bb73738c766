"""TLS of every pybk port: this process's certificate, key and CA, checked at start and reloaded
when the files change; gRPC credentials and `ssl.SSLContext`s built from them.

A server is configured by `ServerTls` (the `tls_cert`, `tls_key`, `tls_ca` options), a client by
`pybk.security.settings.ClientSecurity`. Kubernetes rotates Secrets in place, so servers look at the
files' modification times before each new TLS handshake (at most once a second) and load a changed
set; a replacement that does not pass `check_identity` is logged naming the file and the old
certificate stays in use.
"""
from __future__ import annotations

import datetime
import logging
import ssl
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import grpc
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

from .files import file_stamps
from .settings import ClientSecurity

__all__ = ["CertificateError", "Identity", "ServerTls", "ReloadingSSLContext",
           "check_identity", "client_channel_credentials", "client_ssl_context",
           "server_ssl_context", "RELOAD_CHECK_SECONDS"]

log = logging.getLogger("pybk.security.tls")

RELOAD_CHECK_SECONDS = 1.0  # how often, at most, a server looks at its files' modification times


class CertificateError(ValueError):
    """A certificate, key or CA file cannot be used; the first line names the file and the cause."""


@dataclass(frozen=True)
class ServerTls:
    """A server's TLS files (the tls_cert, tls_key and tls_ca options). With `ca`, client
    certificates are verified against it; `require_client_cert` makes the gRPC port refuse
    clients without one (else a client certificate is optional on both ports)."""

    cert: str
    key: str
    ca: str | None = None
    require_client_cert: bool = False

    @classmethod
    def from_options(cls, client: ClientSecurity, require_client_cert: bool = False) -> "ServerTls | None":
        """From a process's TLS files (its client security options), or None when tls_cert is not
        set. ValueError naming what is missing when only part of it is."""
        if not client.tls_cert:
            if client.tls_key:
                raise ValueError("tls_key is set but tls_cert is not: set both to serve TLS")
            return None
        if not client.tls_key:
            raise ValueError("tls_cert is set but tls_key is not: set both to serve TLS")
        return cls(client.tls_cert, client.tls_key, client.tls_ca, require_client_cert)

    def paths(self) -> tuple[str, ...]:
        return (self.cert, self.key) + ((self.ca,) if self.ca else ())


@dataclass(frozen=True)
class Identity:
    """The checked PEM contents of a ServerTls, and what the certificate says."""

    cert_pem: bytes
    key_pem: bytes
    ca_pem: bytes | None
    common_name: str
    serial: int
    not_after: datetime.datetime


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise CertificateError(f"{path}: unreadable {what}: {exc.strerror or exc}") from None


def _load_certs(path: str, data: bytes, what: str) -> list[x509.Certificate]:
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError as exc:
        raise CertificateError(f"{path}: unreadable {what}: not a PEM certificate ({exc})") from None
    return certs


def _check_validity(path: str, cert: x509.Certificate, now: datetime.datetime) -> None:
    if now > cert.not_valid_after_utc:
        raise CertificateError(f"{path}: certificate expired at {cert.not_valid_after_utc.isoformat()}")
    if now < cert.not_valid_before_utc:
        raise CertificateError(f"{path}: certificate not yet valid (valid from "
                               f"{cert.not_valid_before_utc.isoformat()})")


def _common_name(cert: x509.Certificate) -> str:
    names = cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
    return str(names[0].value) if names else ""


def file_common_name(path: str | Path) -> str:
    """The common name of the (first) certificate in a PEM file; CertificateError naming the file
    if it cannot be read."""
    pem = _read(str(path), "certificate")
    try:
        return _common_name(x509.load_pem_x509_certificate(pem))
    except ValueError as exc:
        raise CertificateError(f"{path}: not a PEM certificate: {exc}") from None


def check_identity(tls: ServerTls, now: datetime.datetime | None = None) -> Identity:
    """Read and check a certificate, its key and (if set) the CA: readable PEM, the certificate
    valid now, the key matching it, the certificate signed by a CA of the bundle. Raises
    CertificateError naming the file and the cause."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    cert_pem = _read(tls.cert, "certificate")
    key_pem = _read(tls.key, "private key")
    ca_pem = _read(tls.ca, "CA bundle") if tls.ca else None
    chain = _load_certs(tls.cert, cert_pem, "certificate")
    cert = chain[0]
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as exc:
        raise CertificateError(f"{tls.key}: unreadable private key: {exc}") from None
    _check_validity(tls.cert, cert, now)
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(serialization.Encoding.DER, spki) != \
            cert.public_key().public_bytes(serialization.Encoding.DER, spki):
        raise CertificateError(f"{tls.key}: key does not match certificate {tls.cert}")
    if ca_pem is not None:
        if not _chains_to(chain, _load_certs(tls.ca, ca_pem, "CA bundle")):
            raise CertificateError(f"{tls.cert}: not signed by the CA in {tls.ca}")
    return Identity(cert_pem, key_pem, ca_pem, _common_name(cert), cert.serial_number, cert.not_valid_after_utc)


def _chains_to(chain: list[x509.Certificate], cas: list[x509.Certificate]) -> bool:
    """Whether the first certificate of `chain` was issued by one of `cas`, directly or through
    the intermediates that follow it in its file."""
    current, rest = chain[0], list(chain[1:])
    for _ in range(len(chain)):
        if any(_issued_by(current, ca) for ca in cas):
            return True
        issuer = next((c for c in rest if _issued_by(current, c)), None)
        if issuer is None:
            return False
        rest.remove(issuer)
        current = issuer
    return False


def _issued_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


class _Watched:
    """A ServerTls whose files are looked at (modification times, at most once per
    RELOAD_CHECK_SECONDS) and reloaded when they changed; a bad replacement is logged and the last
    good identity stays."""

    def __init__(self, tls: ServerTls, on_change: Callable[[Identity], None] | None = None):
        self.tls = tls
        self.identity = check_identity(tls)
        self._stamp = file_stamps(tls.paths())
        self._refused: tuple | None = None
        self._checked = time.monotonic()
        self._lock = threading.Lock()
        self._on_change = on_change

    def poll(self, force: bool = False) -> Identity | None:
        """The new identity if the files changed into a good one since the last look, else None."""
        now = time.monotonic()
        if not force and now - self._checked < RELOAD_CHECK_SECONDS:
            return None
        with self._lock:
            self._checked = now
            stamp = file_stamps(self.tls.paths())
            if stamp == self._stamp or stamp == self._refused:
                return None
            try:
                identity = check_identity(self.tls)
            except CertificateError as exc:
                self._refused = stamp
                log.error("TLS files changed but cannot be used, keeping serial %x (CN %s): %s",
                          self.identity.serial, self.identity.common_name, exc)
                return None
            self._stamp, self._refused, self.identity = stamp, None, identity
            log.info("TLS certificate reloaded from %s: CN %s, serial %x, valid until %s", self.tls.cert,
                     identity.common_name, identity.serial, identity.not_after.isoformat())
            if self._on_change is not None:
                self._on_change(identity)
            return identity


class ReloadingSSLContext:
    """An `ssl.SSLContext` for a server whose certificate follows the files: before each
    handshake (the SNI callback, called for every ClientHello) the files' times are looked at and
    a changed, good set is loaded into the same context (for the connections to come) and into a
    fresh one handed to the connection in progress, which was created with the old certificate.
    Client certificates are verified against tls_ca when sent, and required when `client_cert`
    says so (tls_client_auth on the gRPC port). `alpn` is offered in the handshake (h2 for gRPC)."""

    def __init__(self, tls: ServerTls, alpn: list[str] | None = None, client_cert: bool = False):
        if client_cert and not tls.ca:
            raise CertificateError(f"{tls.cert}: client certificates are required but no tls_ca is set "
                                   f"to verify them with")
        self.alpn, self.client_cert = alpn, client_cert
        self.watched = _Watched(tls)
        self.context = self._new_context()
        self.watched._on_change = self._reload

    def _new_context(self) -> ssl.SSLContext:
        tls = self.watched.tls
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(tls.cert, tls.key)
        ca_pem = self.watched.identity.ca_pem
        if ca_pem:
            ctx.load_verify_locations(cadata=ca_pem.decode())
            ctx.verify_mode = ssl.CERT_REQUIRED if self.client_cert else ssl.CERT_OPTIONAL
        if self.alpn:
            ctx.set_alpn_protocols(self.alpn)
        ctx.sni_callback = self._sni
        return ctx

    def _reload(self, identity: Identity) -> None:
        tls = self.watched.tls
        self.context.load_cert_chain(tls.cert, tls.key)
        if identity.ca_pem:
            self.context.load_verify_locations(cadata=identity.ca_pem.decode())

    def _sni(self, sslobj, server_name, context) -> None:
        try:
            if self.watched.poll() is not None:
                sslobj.context = self._new_context()
        except Exception:  # noqa: BLE001 - never fail a handshake over the reload check
            log.exception("TLS reload check failed")
        return None


def server_ssl_context(tls: ServerTls) -> ReloadingSSLContext:
    """A reloading SSLContext for an admin HTTP server (CertificateError at start if files are bad)."""
    return ReloadingSSLContext(tls)


def _client_check(security: ClientSecurity) -> tuple[bytes, bytes | None, bytes | None]:
    """(CA, client key, client certificate) PEM of a client; CertificateError naming a bad file."""
    ca_pem = _read(security.tls_ca, "CA bundle")
    _load_certs(security.tls_ca, ca_pem, "CA bundle")
    if bool(security.tls_cert) != bool(security.tls_key):
        raise CertificateError(f"{security.tls_cert or security.tls_key}: a client certificate needs both "
                               f"tls_cert and tls_key")
    if not security.tls_cert:
        return ca_pem, None, None
    # the CA checked here verifies servers; the client certificate is for the servers' CA to judge
    identity = check_identity(ServerTls(security.tls_cert, security.tls_key))
    return ca_pem, identity.key_pem, identity.cert_pem


def client_channel_credentials(security: ClientSecurity) -> tuple[grpc.ChannelCredentials, list[tuple[str, str]]]:
    """(channel credentials, extra channel options) for a TLS client: servers verified against
    tls_ca, the client certificate presented if set, tls_server_name expected in server
    certificates (grpc.ssl_target_name_override) if set."""
    ca_pem, key_pem, cert_pem = _client_check(security)
    options = [("grpc.ssl_target_name_override", security.tls_server_name)] if security.tls_server_name else []
    return grpc.ssl_channel_credentials(ca_pem, key_pem, cert_pem), options


def client_ssl_context(security: ClientSecurity) -> ssl.SSLContext:
    """An SSLContext for calling admin HTTP over TLS (server verified against tls_ca, client
    certificate presented if set). Hostname checks use the host dialled, or pass tls_server_name
    as server_hostname yourself."""
    _client_check(security)
    ctx = ssl.create_default_context(cafile=security.tls_ca)
    if security.tls_cert:
        ctx.load_cert_chain(security.tls_cert, security.tls_key)
    return ctx
