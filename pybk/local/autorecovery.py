"""A real `pybk autorecovery` process, for tests, benchmarks and the local runner."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from pybk.security.web import admin_urlopen

from .process import AdminHttp, ChildProcess, free_port


class AutoRecoveryProcess(AdminHttp, ChildProcess):
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

    def http_json(self, path: str, method: str = "GET", body: dict | None = None, timeout: float = 10.0):
        """(status, parsed JSON body) of an admin API call."""
        status, raw = self.http_call(path, method, body, timeout)
        return status, json.loads(raw or b"null")

    def is_ready(self) -> bool:
        with admin_urlopen(self.http_url + "/heartbeat", self.http_security, timeout=1.0) as resp:
            return resp.status == 200

    def start(self, timeout: float = 60.0, wait: bool = True) -> "AutoRecoveryProcess":
        super().start()
        if wait:
            self.wait_ready(self.is_ready, timeout)
        return self
