"""The credentials a client presents: the same names everywhere (options, `PYBK_*`, local.json).

A client program (the ledger library, the shell, Spark executors, autorecovery and the operator
when they call bookies) builds one `ClientSecurity`, by default from the environment, so that
exporting `PYBK_TLS_CA`, `PYBK_TLS_CERT`, `PYBK_TLS_KEY`, `PYBK_TLS_SERVER_NAME` and
`PYBK_TOKEN_FILE` secures every client at once. Only file names travel; secrets stay in files.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Mapping

from pybk.config import COMMON, option_field

__all__ = ["ClientSecurity", "ENV"]


@dataclass(frozen=True)
class ClientSecurity:
    """TLS files and bearer token file of a client; all None means a plaintext, anonymous client."""

    tls_ca: str | None = option_field("tls_ca")
    tls_cert: str | None = option_field("tls_cert")
    tls_key: str | None = option_field("tls_key")
    tls_server_name: str | None = option_field("tls_server_name")
    token_file: str | None = option_field("token_file")

    @classmethod
    def from_mapping(cls, values: Mapping[str, object]) -> "ClientSecurity":
        """From option names (as in local.json's `security` or a YAML config); others are ignored."""
        return cls(**{k: (str(values[k]) if values.get(k) else None) for k in ENV})

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "ClientSecurity":
        """From the variables of ENV (`PYBK_TLS_CA`, `PYBK_TLS_CERT`, ..., `PYBK_TOKEN_FILE`)."""
        environ = os.environ if environ is None else environ
        return cls(**{k: (environ.get(v) or None) for k, v in ENV.items()})

    def as_mapping(self) -> dict[str, str]:
        """The set values by option name (for local.json and Spark options)."""
        return {k: v for k, v in asdict(self).items() if v}

    def as_env(self) -> dict[str, str]:
        """The set values as `PYBK_*` variables (for child processes and Spark executors)."""
        return {ENV[k]: v for k, v in self.as_mapping().items()}

    @property
    def secured(self) -> bool:
        """Whether this client runs with security on: TLS to the servers, or a credential (a client
        certificate, a token) to present."""
        return bool(self.tls_ca or self.tls_cert or self.token_file)

    @property
    def tls(self) -> bool:
        """Whether connections use TLS (a CA to verify servers with is configured)."""
        return self.tls_ca is not None

    def token(self) -> str | None:
        """The bearer token, read from token_file now (files may be rotated), or None."""
        if not self.token_file:
            return None
        return Path(self.token_file).read_text().strip() or None


# option name -> environment variable, as the option table declares them
ENV = {o.name: o.variable for o in COMMON if o.name in {f.name for f in fields(ClientSecurity)}}
