"""A server process's security from its options (bookie, autorecovery): TLS for its ports, who
may call it, the credentials it presents when it calls others, and what it says at start.

`ServerSecurity.from_options(options)` checks everything a start needs (the certificate, key and CA
via `tls.check_identity`, the auth file) and raises `SecurityConfigError` (a CertificateError or
AuthFileError, or a missing option) naming the file and the cause, before any port is bound.
"""
from __future__ import annotations

import ssl
from dataclasses import dataclass, field

from pybk.config import option_field

from .auth import Authenticator
from .settings import ClientSecurity
from .tls import ReloadingSSLContext, ServerTls

__all__ = ["SecurityConfigError", "SecurityOptions", "ServerSecurity", "start_warnings"]


@dataclass(frozen=True)
class SecurityOptions:
    """A server process's security options: its TLS files and credentials (`client`, also what
    it presents when it calls others), who may call it (auth_file) and what anyone may GET."""

    client: ClientSecurity = field(default_factory=ClientSecurity)
    auth_file: str | None = option_field("auth_file")
    open_http_paths: tuple[str, ...] = option_field("open_http_paths")
    tls_client_auth: bool = option_field("tls_client_auth")


class SecurityConfigError(ValueError):
    """The security options do not fit together; the message names the options."""


def start_warnings(auth: bool, tls: bool, endpoint: str) -> list[str]:
    """What a server logs as WARNING at start about its security (docs/security.md)."""
    out = []
    if not auth:
        out.append(f"security is OFF: no --auth-file, so any client that reaches {endpoint} may read, write "
                   f"and administer")
    elif not tls:
        out.append(f"bearer tokens travel in plaintext: --auth-file is set but no --tls-cert, so anyone who "
                   f"can watch the network to {endpoint} can take a token and act with its role")
    return out


@dataclass
class ServerSecurity:
    """The security of one server process."""

    tls: ServerTls | None
    authenticator: Authenticator
    open_paths: tuple[str, ...]
    options: SecurityOptions

    @property
    def client(self) -> ClientSecurity:
        """The credentials this process presents when it calls others."""
        return self.options.client

    @classmethod
    def from_options(cls, options: SecurityOptions) -> "ServerSecurity":
        """From the process's security options; raises SecurityConfigError, CertificateError or
        AuthFileError naming what is wrong."""
        try:
            tls = ServerTls.from_options(options.client, options.tls_client_auth)
        except ValueError as exc:
            raise SecurityConfigError(str(exc)) from None
        if tls is not None and not tls.ca:
            raise SecurityConfigError("tls_cert is set but tls_ca is not: set the CA bundle that signed it "
                                      "(clients, and this process when it calls others, verify with it)")
        if options.tls_client_auth and tls is None:
            raise SecurityConfigError("tls_client_auth needs tls_cert, tls_key and tls_ca")
        if tls is not None:
            from .tls import check_identity
            check_identity(tls)
        authenticator = Authenticator(options.auth_file or None)
        open_paths = tuple(p.strip() for item in options.open_http_paths for p in str(item).split(",")
                           if p.strip())
        return cls(tls, authenticator, open_paths, options)

    @property
    def scheme(self) -> str:
        """`https` when the ports serve TLS, else `http` (for advertised admin URLs)."""
        return "https" if self.tls else "http"

    def grpc_ssl(self) -> ssl.SSLContext | None:
        """A reloading SSLContext for the gRPC port (ALPN h2; client certificates required with
        tls_client_auth), or None for a plaintext port."""
        if not self.tls:
            return None
        return ReloadingSSLContext(self.tls, alpn=["h2"], client_cert=self.tls.require_client_cert).context

    def http_ssl(self) -> ReloadingSSLContext | None:
        """A reloading SSLContext for the admin HTTP server, or None for plain http."""
        return ReloadingSSLContext(self.tls) if self.tls else None

    def warnings(self, endpoint: str) -> list[str]:
        return start_warnings(self.authenticator.enabled, self.tls is not None, endpoint)
