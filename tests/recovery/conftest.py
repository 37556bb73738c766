"""Fixtures and checks for autorecovery tests: real etcd, real bookies, real autorecovery processes."""
from __future__ import annotations

import pytest

from recovery_checks import PASSWORD

FAST = dict(lost_bookie_delay=1.0, open_ledger_grace=2.0, poll_interval=0.2, audit_interval=0,
            ledger_password=PASSWORD.decode(), log_level="DEBUG")


@pytest.fixture
def short_lease_uri(etcd) -> str:
    """Metadata URI whose sessions use a 2 s lease, so killed processes vanish quickly."""
    return etcd.metadata_uri("pybk") + "?lease_ttl=2"


@pytest.fixture
def autorecovery(tmp_path, short_lease_uri):
    """Factory of `pybk autorecovery` processes (FAST options unless overridden); all killed after."""
    from pybk.local.autorecovery import AutoRecoveryProcess

    started: list[AutoRecoveryProcess] = []

    def start(**options) -> AutoRecoveryProcess:
        opts = {**FAST, **options}
        p = AutoRecoveryProcess(tmp_path / f"autorecovery-{len(started)}.log", short_lease_uri, **opts)
        started.append(p)
        return p.start()

    try:
        yield start
    finally:
        for p in started:
            p.kill()


