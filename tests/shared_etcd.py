"""One test's view of the session's shared etcd: a key prefix of its own (imported by name)."""
from __future__ import annotations

import base64
import json
import urllib.request

from pybk.local.etcd import EtcdProcess


class SharedEtcdError(RuntimeError):
    """A test tried to stop or restart the etcd every test shares."""


class EtcdNamespace:
    """The shared etcd as one test sees it: every metadata URI it hands out lives under
    `/<namespace>/`, so a store, bookie or process of this test never reads or lists another
    test's keys. Stopping or restarting is refused: such a test needs its own etcd."""

    def __init__(self, proc: EtcdProcess, namespace: str):
        self._proc = proc
        self.namespace = namespace

    def metadata_uri(self, prefix: str = "pybk", **options: str) -> str:
        return self._proc.metadata_uri(f"{self.namespace}/{prefix}", **options)

    def __getattr__(self, name: str):
        if name in ("start", "stop", "restart", "kill", "signal"):
            raise SharedEtcdError(f"etcd.{name}(): this test shares the session's etcd; mark it "
                                  "@pytest.mark.private_etcd to get one of its own (tests/conftest.py)")
        return getattr(self._proc, name)

    def clear(self) -> None:
        """Delete every key of this namespace (etcd's JSON gateway: no client, no process)."""
        key = f"/{self.namespace}/".encode()
        end = key[:-1] + bytes([key[-1] + 1])
        body = json.dumps({"key": base64.b64encode(key).decode(),
                           "range_end": base64.b64encode(end).decode()}).encode()
        request = urllib.request.Request(self._proc.client_url + "/v3/kv/deleterange", body,
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()
