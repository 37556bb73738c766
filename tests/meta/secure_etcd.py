"""A real etcd with TLS on its client port and etcd auth on for the `pybk` prefix (users `pybk`,
readwrite, and `pybk-reader`, read; passwords in files), for the tests of etcd security."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pybk.local.etcd import EtcdProcess, EtcdTls
from pybk.meta.etcd_auth import enable_auth
from pybk.security.ca import CertificateAuthority, TlsFiles, write_private

ROOT_PASSWORD = "root-pw-4d1f0c9e7b"
PASSWORDS = {"pybk": "writer-pw-8a2c61d5e3", "pybk-reader": "reader-pw-27b9e04f6a"}
ACCESS = {"pybk": "readwrite", "pybk-reader": "read"}


@dataclass
class SecureEtcd:
    proc: EtcdProcess
    ca: CertificateAuthority
    files: TlsFiles
    password_files: dict[str, Path]

    def uri(self, user: str | None = None, prefix: str = "pybk", **options) -> str:
        """The metadata URI over TLS (with etcd's own certificate as client certificate when etcd
        wants one), as `user` when given (its password file)."""
        if user is not None:
            options.update(user=user, password_file=str(self.password_files[user]))
        return self.proc.metadata_uri(prefix, **options)


async def start_secure_etcd(base: Path, client_cert_auth: bool = False,
                            auth_token_ttl: int | None = None) -> SecureEtcd:
    ca = CertificateAuthority.create()
    files = ca.write_identity(base / "tls", "etcd", ["localhost", "127.0.0.1"])
    proc = EtcdProcess(base / "data", tls=EtcdTls(files.cert, files.key, files.ca, client_cert_auth),
                       auth_token_ttl=auth_token_ttl)
    proc.start()
    try:
        password_files = {user: write_private(base / f"{user}.password", pw.encode() + b"\n")
                          for user, pw in PASSWORDS.items()}
        await enable_auth(proc.metadata_uri("pybk"), ROOT_PASSWORD,
                          {user: (PASSWORDS[user], ACCESS[user]) for user in PASSWORDS})
    except BaseException:
        proc.stop()
        raise
    return SecureEtcd(proc, ca, files, password_files)
