"""The test harness runs a real etcd that answers and can be restarted on its data dir."""
import subprocess
from pathlib import Path

from pybk.local.etcd import etcd_binary


def _etcdctl(etcd, *args):
    ctl = str(Path(etcd_binary()).with_name("etcdctl"))
    return subprocess.run([ctl, "--endpoints", etcd.client_url, *args],
                          capture_output=True, text=True, timeout=10, check=True).stdout


def test_etcd_keeps_data_across_restart(etcd):
    _etcdctl(etcd, "put", "/k", "v1")
    etcd.restart()
    assert _etcdctl(etcd, "get", "/k", "--print-value-only").strip() == "v1"
