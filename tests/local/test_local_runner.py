"""The local runner's process supervision, shown with etcd alone (bookies: test_local_cluster.py)."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from pybk.local import runner

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cluster.yaml"


def _etcd_only():
    return dataclasses.replace(runner.load_spec(EXAMPLE), replicas=0)


def test_restart_keeps_ports_and_metadata_uri(tmp_path):
    cluster = runner.LocalCluster(_etcd_only(), tmp_path)
    try:
        first = cluster.start()
    finally:
        cluster.stop()
    assert not (tmp_path / "local.json").exists()
    again = runner.LocalCluster(_etcd_only(), tmp_path)
    try:
        second = again.start()
        assert second["metadata_service_uri"] == first["metadata_service_uri"]
        assert second["etcd"]["client_url"] == first["etcd"]["client_url"]
        assert json.loads((tmp_path / "local.json").read_text()) == second
    finally:
        again.stop()
    assert not runner.pid_alive(second["etcd"]["pid"])


def test_bookie_ports_and_dirs_are_stable_per_ordinal(tmp_path):
    a = runner.LocalCluster(_etcd_only(), tmp_path).slot(1)
    b = runner.LocalCluster(_etcd_only(), tmp_path).slot(1)
    assert (a.bookie_id, a.grpc, a.http, a.journal_dir) == (b.bookie_id, b.grpc, b.http, b.journal_dir)
    assert a.journal_dir == tmp_path.resolve() / "bookie-1" / "journal"
    assert a.ledger_dirs == [tmp_path.resolve() / "bookie-1" / "ledgers"]
    assert a.grpc_port != a.http_port
