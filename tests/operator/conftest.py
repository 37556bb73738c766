"""Fixtures of the operator's tests."""
from __future__ import annotations

import pytest

from kube_api import KubeApiServer


@pytest.fixture
def kube():
    """The emulated Kubernetes API (kmock behind kube_api's shims), on a loopback port."""
    server = KubeApiServer().start()
    try:
        yield server
    finally:
        server.stop()
