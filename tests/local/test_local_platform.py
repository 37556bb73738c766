"""The local platform's processes and their stable slots, shown with etcd alone (bookies: test_local_cluster.py)."""
from __future__ import annotations

import dataclasses
import json
import socket
from pathlib import Path

from pybk.cluster.actions import StartDecommission
from pybk.cluster.observed import DecommissionPhase
from pybk.local import slots
from pybk.local.control import pid_alive
from pybk.local.manifest import load_spec
from pybk.local.platform import LocalCluster
from pybk.meta import MetadataStore

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cluster.yaml"


def _etcd_only():
    return dataclasses.replace(load_spec(EXAMPLE), replicas=0)


def test_restart_keeps_ports_and_metadata_uri(tmp_path, child_processes):
    cluster = LocalCluster(_etcd_only(), tmp_path)
    try:
        first = cluster.start()
    finally:
        cluster.stop()
    assert not (tmp_path / "local.json").exists()
    again = LocalCluster(_etcd_only(), tmp_path)
    try:
        second = again.start()
        assert second["metadata_service_uri"] == first["metadata_service_uri"]
        assert second["etcd"]["client_url"] == first["etcd"]["client_url"]
        assert json.loads((tmp_path / "local.json").read_text()) == second
    finally:
        again.stop()
    assert not pid_alive(second["etcd"]["pid"])


def test_bookie_ports_and_dirs_are_stable_per_ordinal(tmp_path):
    a = LocalCluster(_etcd_only(), tmp_path).slot(1)
    b = LocalCluster(_etcd_only(), tmp_path).slot(1)
    assert (a.bookie_id, a.grpc, a.http, a.journal_dir) == (b.bookie_id, b.grpc, b.http, b.journal_dir)
    assert a.journal_dir == tmp_path.resolve() / "bookie-1" / "journal"
    assert a.ledger_dirs == [tmp_path.resolve() / "bookie-1" / "ledgers"]
    assert a.grpc_port != a.http_port


async def test_a_decommission_of_a_bookie_etcd_does_not_know_counts_as_done(metadata_uri, tmp_path):
    """A bookie that never registered (no cookie, no ledger names it) has nothing to drain: the
    local platform's decommission records it as done at once, so a scale-down can go on."""
    cluster = LocalCluster(_etcd_only(), tmp_path / "local")
    store = await MetadataStore.connect(metadata_uri)
    try:
        await cluster.act(store, StartDecommission("bookie-3", 3))
        observed = cluster.observe(*await cluster.observe_metadata(store))
    finally:
        await store.close()
    assert observed.bookie(3).decommission is DecommissionPhase.DONE


def test_a_bookie_whose_port_is_taken_before_it_binds_starts_on_new_ports(tmp_path, child_processes, monkeypatch):
    """Another process can take a bookie's port between its choice and the bookie's bind (at four
    test workers it happened): the bookie says so and exits before it touches its dirs, and the
    cluster starts it again on new ports instead of failing `pybk local up`. The race is made
    certain by holding the recorded port while the check that it is free looks away."""
    cluster = LocalCluster(_etcd_only(), tmp_path)
    taken = cluster.slot(0).grpc_port
    really_free = slots.port_free
    monkeypatch.setattr(slots, "port_free", lambda host, port: port == taken or really_free(host, port))
    with socket.create_server(("127.0.0.1", taken)):
        try:
            cluster.start_etcd()
            cluster.start_bookie(0, wait=False)
            cluster.wait_bookie(0)
            bookie = cluster.bookies[0]
            assert bookie.is_ready() and bookie.port != taken and bookie.bookie_id == "bookie-0"
            recorded = json.loads(cluster.ports.path.read_text())["bookies"]["bookie-0"]
            assert recorded == {"grpc": bookie.port, "http": bookie.http_port}  # a restart keeps the new ports
            assert f"cannot listen for gRPC on 127.0.0.1:{taken}" in bookie.log_path.read_text()
        finally:
            cluster.stop()
