"""A real `pybk bookie` process on free loopback ports, for tests and the local runner."""
from __future__ import annotations

import json
import sys
from http import HTTPStatus
from pathlib import Path
from typing import Callable

from .process import AdminHttp, ChildProcess, free_port


class BookieProcess(AdminHttp, ChildProcess):
    """One bookie with its own journal and ledger dirs under `base_dir`.

    kill() is kill -9; stop() is SIGTERM; restart() starts it again on the same dirs and ports.
    Extra options become flags: BookieProcess(d, metadata_uri=..., high_water_mark=0.5, zone="a").
    """

    def __init__(self, base_dir: Path, metadata_uri: str | None = None, host: str = "127.0.0.1",
                 port: int | None = None, http_port: int | None = None, bookie_id: str | None = None,
                 journal_dir: Path | None = None, ledger_dirs: list[Path] | None = None, **options):
        self.base_dir = Path(base_dir)
        self.host = host
        self._chosen_ports = not port and not http_port and not bookie_id  # ours to change on a retry
        self.port = port or free_port(host)
        self.http_port = http_port or free_port(host)
        self.bookie_id = bookie_id or f"{host}:{self.port}"
        self.journal_dir = Path(journal_dir or self.base_dir / "journal")
        self.ledger_dirs = [Path(d) for d in (ledger_dirs or [self.base_dir / "ledgers"])]
        self.metadata_uri = metadata_uri
        self.options = dict(options)
        super().__init__(f"bookie {self.bookie_id}", self._argv(), self.base_dir / "bookie.log")

    def _argv(self) -> list[str]:
        argv = [sys.executable, "-m", "pybk.cli", "bookie", "--host", self.host, "--port", str(self.port),
                "--http-port", str(self.http_port), "--bookie-id", self.bookie_id,
                "--journal-dir", str(self.journal_dir)]
        for d in self.ledger_dirs:
            argv += ["--ledger-dir", str(d)]
        if self.metadata_uri:
            argv += ["--metadata-uri", self.metadata_uri]
        for k, v in self.options.items():
            argv += ["--" + k.replace("_", "-"), str(v).lower() if isinstance(v, bool) else str(v)]
        return argv

    @property
    def address(self) -> str:
        """host:port of the gRPC service (what BookieClient.connect takes)."""
        return f"{self.host}:{self.port}"

    def http_get(self, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
        """(status, body) of a GET of its admin API."""
        return self.http_call(path, timeout=timeout)

    def http_json(self, path: str, method: str = "GET", body: dict | None = None, timeout: float = 5.0):
        """The parsed JSON answer of an admin API call (an error status raises HTTPError)."""
        from pybk.security.web import admin_urlopen
        with admin_urlopen(self.http_url + path, self.http_security, method, body, timeout) as resp:
            return json.loads(resp.read())

    def is_ready(self) -> bool:
        status, _ = self.http_get("/api/v1/bookie/is_ready", timeout=1.0)
        return status == HTTPStatus.OK

    def start(self, timeout: float = 60.0, wait: bool = True) -> "BookieProcess":
        """Start the process; with wait, return once /api/v1/bookie/is_ready answers 200."""
        self.argv = self._argv()
        super().start()
        if wait:
            self.wait_ready(self.is_ready, timeout)
        return self

    def wait_started(self, timeout: float = 60.0, attempts: int = 3,
                     elsewhere: Callable[[], "BookieProcess"] | None = None) -> None:
        """Wait until ready after start(wait=False). A first start whose ports another process took
        meanwhile exits saying so, before touching its dirs; it is started again on new ports:
        by `elsewhere()`, which returns the process it started, else on new free ports here (only
        when we chose the ports and the id derived from them)."""
        proc = self
        for attempt in range(attempts):
            try:
                proc.wait_ready(proc.is_ready, timeout)
                return
            except RuntimeError:
                if (attempt + 1 == attempts or (elsewhere is None and not proc._chosen_ports)
                        or not proc.lost_its_port()):
                    raise
            proc = elsewhere() if elsewhere is not None else proc._on_new_free_ports()

    def _on_new_free_ports(self) -> "BookieProcess":
        self.port, self.http_port = free_port(self.host), free_port(self.host)
        self.bookie_id = f"{self.host}:{self.port}"
        self.name = f"bookie {self.bookie_id}"
        return self.start(wait=False)

    def lost_its_port(self) -> bool:
        """True when the process exited because another process took one of its ports between
        their choice and its bind: it says so before it touches its dirs, so starting it again on
        other ports is safe."""
        return not self.alive() and "cannot listen for" in self.log_tail(5)

    def restart(self, timeout: float = 60.0) -> "BookieProcess":
        """Stop (SIGTERM) and start again on the same dirs and ports."""
        self.stop()
        return self.start(timeout)

    def exit_code(self, timeout: float = 60.0) -> int:
        """Wait for the process to exit by itself (e.g. a refused start); its exit code."""
        return self.proc.wait(timeout)
