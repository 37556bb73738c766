"""A throwaway certificate authority: what `pybk local up --secure` and the tests use for TLS.

One EC P-256 CA signs leaf certificates valid for both ends of a connection (server and client
auth), so one certificate per process serves its ports and authenticates its outgoing calls.
Private keys are written with mode 0600. Not for production PKI: a real cluster uses its own CA
(cert-manager on Kubernetes).
"""
from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["CertificateAuthority", "TlsFiles", "write_private"]

DEFAULT_DAYS = 365


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def write_private(path: Path, data: bytes) -> Path:
    """Write a secret (key, token, password) readable by its owner only, atomically."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    return path


@dataclass(frozen=True)
class TlsFiles:
    """Where one identity's PEM files are: its certificate, its key and the CA that signed it."""

    cert: Path
    key: Path
    ca: Path


@dataclass(frozen=True)
class CertificateAuthority:
    """A CA certificate and its private key (PEM)."""

    cert_pem: bytes
    key_pem: bytes

    @classmethod
    def create(cls, name: str = "pybk throwaway CA", days: int = DEFAULT_DAYS) -> "CertificateAuthority":
        """A new self-signed CA, valid from now for `days` days."""
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = _now()
        cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=days))
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                             content_commitment=False, key_encipherment=False,
                                             data_encipherment=False, key_agreement=False,
                                             encipher_only=False, decipher_only=False), critical=True)
                .sign(key, hashes.SHA256()))
        return cls(cert.public_bytes(serialization.Encoding.PEM), _pem_key(key))

    def issue(self, common_name: str, hosts: Iterable[str] = ("localhost", "127.0.0.1"),
              days: int = DEFAULT_DAYS, not_before: datetime.datetime | None = None,
              not_after: datetime.datetime | None = None) -> tuple[bytes, bytes]:
        """(certificate PEM, key PEM) for `common_name`, valid for the given host names and IP
        addresses, usable as server and as client certificate. not_before/not_after override the
        validity (tests make expired certificates this way)."""
        ca_cert = x509.load_pem_x509_certificate(self.cert_pem)
        ca_key = serialization.load_pem_private_key(self.key_pem, password=None)
        key = ec.generate_private_key(ec.SECP256R1())
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        now = _now()
        start = not_before or now - datetime.timedelta(minutes=5)
        end = not_after or now + datetime.timedelta(days=days)
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
                   .issuer_name(ca_cert.subject).public_key(key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(start).not_valid_after(end)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                         ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)

    def write_identity(self, directory: Path, common_name: str,
                       hosts: Iterable[str] = ("localhost", "127.0.0.1"), **validity) -> TlsFiles:
        """Issue a certificate for `common_name` and write `tls.crt`, `tls.key` and `ca.crt` into
        `directory` (the layout of a Kubernetes TLS Secret)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        cert, key = self.issue(common_name, hosts, **validity)
        files = TlsFiles(directory / "tls.crt", directory / "tls.key", directory / "ca.crt")
        files.cert.write_bytes(cert)
        write_private(files.key, key)
        files.ca.write_bytes(self.cert_pem)
        return files
