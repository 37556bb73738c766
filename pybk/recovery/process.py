"""A real `pybk autorecovery` process, for tests, benchmarks and the local runner."""
from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from pathlib import Path

from pybk.local.process import ChildProcess, free_port
from pybk.security.settings import ClientSecurity
from pybk.security.web import admin_urlopen


class AutoRecoveryProcess(ChildProcess):
    """`pybk autorecovery` with its admin HTTP on a free loopback port.

    Options become flags: AutoRecoveryProcess(log, uri, lost_bookie_delay=1, ledger_password="pw").
    A list value repeats the flag.
    """

    def __init__(self, log_path: Path, metadata_uri: str, name: str | None = None, host: str = "127.0.0.1",
                 http_port: int | None = None, **options):
        self.host = host
        self.http_port = http_port or free_port(host)
        self.metadata_uri = metadata_uri
        self.options = dict(options)
        self.recovery_name = name or f"autorecovery-{self.http_port}"
        argv = [sys.executable, "-m", "pybk.cli", "autorecovery", "--metadata-uri", metadata_uri,
                "--http-port", str(self.http_port), "--http-host", host, "--name", self.recovery_name]
        for k, v in self.options.items():
            for one in (v if isinstance(v, (list, tuple)) else [v]):
                if one is True:
                    argv.append("--" + k.replace("_", "-"))
                elif one is not False and one is not None:
                    argv += ["--" + k.replace("_", "-"), str(one)]
        super().__init__(self.recovery_name, argv, Path(log_path))

    @property
    def tls(self) -> bool:
        """Whether its admin HTTP serves TLS (it was given tls_cert)."""
        return bool(self.options.get("tls_cert"))

    @property
    def http_url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.http_port}"

    @property
    def http_security(self) -> ClientSecurity:
        """What its admin HTTP is called with: its own tls_* (verifying with its tls_ca) and token_file."""
        return ClientSecurity.from_mapping(self.options)

    def http_json(self, path: str, method: str = "GET", body: dict | None = None, timeout: float = 10.0):
        """(status, parsed JSON body) of an admin API call."""
        try:
            with admin_urlopen(self.http_url + path, self.http_security, method, body, timeout) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def is_ready(self) -> bool:
        with admin_urlopen(self.http_url + "/heartbeat", self.http_security, timeout=1.0) as resp:
            return resp.status == 200

    def start(self, timeout: float = 60.0, wait: bool = True) -> "AutoRecoveryProcess":
        super().start()
        if wait:
            self.wait_ready(self.is_ready, timeout)
        return self
