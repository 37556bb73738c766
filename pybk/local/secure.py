"""`pybk local up --secure`: the one-time security setup of a local cluster's data dir.

Everything lives under DIR/security/ and is created once, then reused by every later `up` of the
same data dir (secure mode is remembered: DIR/security/secure.json marks a finished setup):

    DIR/security/ca.crt, ca.key            the throwaway CA (key 0600)
    DIR/security/<identity>/tls.{crt,key}  one certificate per kind of process (bookie, autorecovery,
                                           etcd) and per client role (admin, writer, reader), CN
                                           pybk-<identity>, for 127.0.0.1 and localhost (+ ca.crt)
    DIR/security/tokens/<role>.token       random bearer tokens: admin, writer, reader (0600)
    DIR/security/auth.yaml                 the bookies' and autorecovery's auth file: tokens by
                                           sha256, certificate subjects by CN, each with its role
    DIR/security/etcd-users/<user>.password etcd passwords: root, pybk (read-write), pybk-reader (0600)
    DIR/security/secure.json               the setup is complete (file names only)

Only file names ever leave this directory (flags, local.json, URIs); the secrets stay in files.
A data dir that already holds an insecure cluster's data is refused: its ledger metadata may still
carry master keys, readable by every etcd user (docs/security.md, "local").
"""
from __future__ import annotations

import enum
import hashlib
import json
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from pybk.security.ca import CertificateAuthority, TlsFiles, write_private
from pybk.security.roles import Role
from pybk.security.settings import ClientSecurity

from .errors import LocalClusterError

if TYPE_CHECKING:
    from .etcd import EtcdTls

SECURITY_DIR = "security"
MARKER = "secure.json"
HOSTS = ("127.0.0.1", "localhost")
CN_PREFIX = "pybk-"


class Identity(enum.StrEnum):
    """Who holds a certificate of the local CA; the certificate's CN is `pybk-<identity>`."""

    BOOKIE = "bookie"              # every local bookie (one certificate: ordinals come and go)
    AUTORECOVERY = "autorecovery"  # every local autorecovery process
    ETCD = "etcd"                  # the etcd server
    ADMIN = "admin"                # the client identity local.json hands to shell, demo, Spark
    WRITER = "writer"              # client identities for the lower roles, for trying them out
    READER = "reader"

    @property
    def common_name(self) -> str:
        return CN_PREFIX + self.value


# the role each certificate subject gets in the auth file; bookies may run autorecovery in-process
SUBJECT_ROLES: dict[Identity, Role] = {Identity.BOOKIE: Role.ADMIN, Identity.AUTORECOVERY: Role.ADMIN,
                                       Identity.ADMIN: Role.ADMIN, Identity.WRITER: Role.WRITER,
                                       Identity.READER: Role.READER}
# the client identity of each role
CLIENT_IDENTITY: dict[Role, Identity] = {Role.ADMIN: Identity.ADMIN, Role.WRITER: Identity.WRITER,
                                         Role.READER: Identity.READER}


class EtcdUser(enum.StrEnum):
    """The etcd users of a secure local cluster: root (enables auth), read-write and read-only on the prefix."""

    ROOT = "root"
    READWRITE = "pybk"
    READ = "pybk-reader"


def token_digest(token: str) -> str:
    """How the auth file names a token: the hex sha256 of its text."""
    return hashlib.sha256(token.encode()).hexdigest()


def auth_document(tokens: dict[Role, str]) -> dict:
    """The auth file's content (docs/security.md): each token by sha256 with its role, and each
    certificate subject of the local CA with its role. Pure, for the setup and the tests."""
    return {"tokens": [{"name": f"local-{role}", "role": str(role), "sha256": token_digest(token)}
                       for role, token in sorted(tokens.items())],
            "subjects": [{"cn": ident.common_name, "role": str(role)} for ident, role in SUBJECT_ROLES.items()]}


@dataclass(frozen=True)
class LocalSecurity:
    """The security files of one local cluster's data dir (names only; see the module doc)."""

    root: Path

    @classmethod
    def of(cls, data_dir: str | Path) -> "LocalSecurity":
        return cls(Path(data_dir).resolve() / SECURITY_DIR)

    @property
    def ca_cert(self) -> Path:
        return self.root / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.root / "ca.key"

    @property
    def auth_file(self) -> Path:
        return self.root / "auth.yaml"

    @property
    def marker(self) -> Path:
        return self.root / MARKER

    def identity(self, who: Identity) -> TlsFiles:
        d = self.root / who.value
        return TlsFiles(d / "tls.crt", d / "tls.key", d / "ca.crt")

    def token_file(self, role: Role) -> Path:
        return self.root / "tokens" / f"{role}.token"

    def etcd_password_file(self, user: EtcdUser) -> Path:
        return self.root / "etcd-users" / f"{user.value}.password"

    @property
    def ready(self) -> bool:
        """Whether the setup finished here (secure mode is on for this data dir)."""
        return self.marker.exists()

    # -- what each process is given ---------------------------------------------------------
    def server_options(self, who: Identity) -> dict[str, str]:
        """Options (flag names) of a bookie or autorecovery process: its TLS identity, the CA, the
        auth file, and the admin token it presents when it calls bookies (autorecovery; a bookie
        running autorecovery in-process)."""
        files = self.identity(who)
        return {"tls_cert": str(files.cert), "tls_key": str(files.key), "tls_ca": str(self.ca_cert),
                "auth_file": str(self.auth_file), "token_file": str(self.token_file(Role.ADMIN))}

    def client(self, role: Role = Role.ADMIN) -> ClientSecurity:
        """What a client of `role` presents: the CA, the role's client certificate and token."""
        files = self.identity(CLIENT_IDENTITY[role])
        return ClientSecurity(tls_ca=str(self.ca_cert), tls_cert=str(files.cert), tls_key=str(files.key),
                              token_file=str(self.token_file(role)))

    def etcd_tls(self) -> "EtcdTls":
        """etcd's TLS: its certificate, served to clients that verify it with the local CA."""
        from .etcd import EtcdTls
        files = self.identity(Identity.ETCD)
        return EtcdTls(cert=files.cert, key=files.key, ca=self.ca_cert)

    def etcd_login(self, user: EtcdUser = EtcdUser.READWRITE) -> dict[str, str]:
        """The metadata URI options that log in to etcd as `user` (its name and password file)."""
        return {"user": user.value, "password_file": str(self.etcd_password_file(user))}

    def etcd_users(self) -> dict[EtcdUser, str]:
        """The password of each etcd user, read from its file (to enable etcd auth with)."""
        return {user: self.etcd_password_file(user).read_text().strip() for user in EtcdUser}

    def token_files(self) -> dict[str, str]:
        """role -> token file, for local.json (so a user can act as reader or writer)."""
        return {str(role): str(self.token_file(role)) for role in Role}

    # -- setup ------------------------------------------------------------------------------
    def ensure(self) -> "LocalSecurity":
        """Create the CA, certificates, tokens, auth file and etcd passwords unless a finished
        setup is there (then reuse it). A half-done setup (interrupted) is started over."""
        if self.ready:
            return self
        if self.root.exists():
            shutil.rmtree(self.root)
        self.root.mkdir(parents=True, mode=0o700)
        ca = CertificateAuthority.create(name="pybk local CA")
        self.ca_cert.write_bytes(ca.cert_pem)
        write_private(self.ca_key, ca.key_pem)
        for who in Identity:
            ca.write_identity(self.root / who.value, who.common_name, HOSTS)
        (self.root / "tokens").mkdir(mode=0o700)
        tokens = {role: secrets.token_urlsafe(32) for role in Role}
        for role, token in tokens.items():
            write_private(self.token_file(role), token.encode())
        write_private(self.auth_file, yaml.safe_dump(auth_document(tokens), sort_keys=False).encode())
        (self.root / "etcd-users").mkdir(mode=0o700)
        for user in EtcdUser:
            write_private(self.etcd_password_file(user), secrets.token_urlsafe(24).encode())
        self.marker.write_text(json.dumps({"ca": str(self.ca_cert), "auth_file": str(self.auth_file)}, indent=2)
                               + "\n")
        return self


def secure_mode(data_dir: str | Path, asked: bool, has_data: bool) -> bool:
    """Whether `up` runs secured: asked for (--secure) or remembered from an earlier secure `up`.

    Refused (LocalClusterError): --secure on a data dir whose etcd already holds an insecure
    cluster's data, whose ledger metadata may carry master keys every etcd reader could see."""
    security = LocalSecurity.of(data_dir)
    if security.ready:
        return True
    if asked and has_data:
        raise LocalClusterError(
            f"--secure refused: {data_dir} holds a cluster started without --secure, whose ledger "
            f"metadata may carry master keys readable by every etcd user; start the secure cluster in a "
            f"new data dir (--data-dir), or delete {data_dir} first")
    return asked
