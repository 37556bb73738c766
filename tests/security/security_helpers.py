"""Helpers of the security tests (imported by name: tests/ has no packages): certificates from a
throwaway CA (pybk.security.ca), an auth file giving one token per role, admin HTTP calls."""
from __future__ import annotations

import hashlib
import json
import secrets
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

from pybk.security.ca import CertificateAuthority, TlsFiles, write_private
from pybk.security.settings import ClientSecurity
from pybk.security.tls import client_ssl_context


@dataclass
class Pki:
    """A CA, the bookies' identity, and a token file per role (reader, writer, admin)."""

    dir: Path
    ca: CertificateAuthority
    server: TlsFiles
    tokens: dict[str, Path]
    auth_file: Path

    def client(self, role: str | None = None, tls: bool = True) -> ClientSecurity:
        """A client's settings: TLS with this CA, and the token of `role` (None: no token)."""
        return ClientSecurity(tls_ca=str(self.server.ca) if tls else None,
                              token_file=str(self.tokens[role]) if role else None)

    def bookie_options(self, **extra) -> dict:
        """`pybk bookie` options serving TLS with the bookie identity and authenticating callers."""
        return {"tls_cert": self.server.cert, "tls_key": self.server.key, "tls_ca": self.server.ca,
                "auth_file": self.auth_file, **extra}

    def http(self, url: str, method: str = "GET", role: str | None = None, body: dict | None = None,
             token: str | None = None) -> tuple[int, object]:
        """(status, parsed JSON or text) of an admin HTTP call over TLS with role's token."""
        headers = {"Content-Type": "application/json"}
        token = token or (self.tokens[role].read_text().strip() if role else None)
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url, data=data, method=method, headers=headers)
        ctx = client_ssl_context(self.client())
        try:
            with urllib.request.urlopen(req, timeout=30, context=ctx) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw.decode()


def make_pki(directory: Path) -> Pki:
    ca = CertificateAuthority.create()
    server = ca.write_identity(directory / "bookie", "pybk-bookie")
    tokens = {}
    entries = []
    for role in ("reader", "writer", "admin"):
        token = secrets.token_urlsafe(24)
        tokens[role] = write_private(directory / f"{role}.token", token.encode())
        if role == "admin":  # one entry by token file, the others by hash: both forms of the file
            entries.append({"name": f"{role}-client", "role": role, "token_file": str(tokens[role])})
        else:
            entries.append({"name": f"{role}-client", "role": role,
                            "sha256": hashlib.sha256(token.encode()).hexdigest()})
    auth_file = directory / "auth.yaml"
    auth_file.write_text(yaml.safe_dump({"tokens": entries, "subjects": [{"cn": "pybk-spark", "role": "reader"}]}))
    return Pki(directory, ca, server, tokens, auth_file)


def served_certificate(host: str, port: int, ca: Path) -> bytes:
    """The DER certificate a TLS port serves to a new connection (verified against ca)."""
    import socket
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.set_alpn_protocols(["h2", "http/1.1"])
    with socket.create_connection((host, port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname=host) as tls:
            return tls.getpeercert(binary_form=True)
