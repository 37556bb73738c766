"""The test harness runs a real etcd that answers and can be restarted on its data dir."""
import subprocess
from pathlib import Path

import pytest

from pybk.local.etcd import etcd_binary


def _etcdctl(etcd, *args):
    ctl = str(Path(etcd_binary()).with_name("etcdctl"))
    return subprocess.run([ctl, "--endpoints", etcd.client_url, *args],
                          capture_output=True, text=True, timeout=10, check=True).stdout


@pytest.mark.private_etcd
def test_etcd_keeps_data_across_restart(etcd):
    _etcdctl(etcd, "put", "/k", "v1")
    etcd.restart()
    assert _etcdctl(etcd, "get", "/k", "--print-value-only").strip() == "v1"


async def test_a_test_under_one_prefix_cannot_list_another_tests_ledgers(shared_etcd):
    """Two tests' views of the shared etcd: each lists only the ledgers it created, and clearing
    one view deletes its keys and leaves the other's."""
    from pybk.meta import MetadataStore
    from shared_etcd import EtcdNamespace

    views = [EtcdNamespace(shared_etcd, f"isolation-{i}") for i in range(2)]
    stores = [await MetadataStore.connect(v.metadata_uri("pybk")) for v in views]
    try:
        created = [{(await s.ledgers.create(["b1:1"], 1, 1)).ledger_id for _ in range(3)} for s in stores]
        listed = [{lid async for lid in s.ledgers.list()} for s in stores]
        assert listed == created
        views[0].clear()
        assert [lid async for lid in stores[0].ledgers.list()] == []
        assert {lid async for lid in stores[1].ledgers.list()} == created[1]
    finally:
        for s in stores:
            await s.close()
        views[1].clear()


def test_the_shared_etcd_refuses_to_be_stopped_by_one_test(etcd):
    with pytest.raises(RuntimeError, match="private_etcd"):
        etcd.stop()
    assert etcd.healthy()
