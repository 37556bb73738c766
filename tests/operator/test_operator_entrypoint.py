"""The image's bookie entrypoint derives the bookie id, host and zone from the pod's environment."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENTRYPOINT = ROOT / "bookie_image" / "entrypoint.sh"


def run(env: dict[str, str]) -> subprocess.CompletedProcess:
    path = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
    return subprocess.run(["sh", str(ENTRYPOINT), "--help"], capture_output=True, text=True, timeout=120,
                          env={"PATH": path, "HOME": os.environ.get("HOME", "/tmp"), **env})


@pytest.mark.skipif(shutil.which("sh") is None, reason="no POSIX shell")
def test_entrypoint_derives_id_host_and_zone_then_runs_pybk_bookie():
    out = run({"POD_NAME": "ledgers-2", "POD_NAMESPACE": "pybk", "PYBK_SERVICE": "ledgers",
               "POD_IP": "10.1.2.3", "PYBK_ZONE_WAIT": "0", "PYBK_PORT": "3181"})
    assert out.returncode == 0, out.stderr
    assert "bookie-entrypoint: id=ledgers-2.ledgers.pybk.svc:3181 host=10.1.2.3 zone=<none>" in out.stderr
    assert "--journal-dir" in out.stdout  # the real `pybk bookie --help` ran


def test_entrypoint_outside_kubernetes_gets_no_zone_and_says_why():
    out = run({"POD_NAME": "bk-0", "POD_NAMESPACE": "ns", "PYBK_SERVICE": "bk", "PYBK_ZONE_WAIT": "1"})
    assert out.returncode == 0, out.stderr
    assert "not in a Kubernetes pod" in out.stderr and "zone=<none>" in out.stderr


def test_entrypoint_without_pod_env_fails_clearly():
    out = run({"PYBK_SERVICE": "bk"})
    assert out.returncode != 0 and "POD_NAME must be set" in out.stderr
