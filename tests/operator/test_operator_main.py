"""`pybk operator --check FILE` validates a manifest offline with a clear answer and exit code."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def check(path: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pybk.cli", "operator", "--check", path, *extra],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_check_accepts_valid_and_rejects_invalid_manifests_with_reasons(child_processes):
    ok = check("examples/bookiecluster-full.yaml")
    assert ok.returncode == 0 and "valid" in ok.stdout
    bad = check("examples/bookiecluster-invalid-ack-above-write.yaml", "-o", "json")
    assert bad.returncode == 1
    assert json.loads(bad.stdout)["errors"] == [".spec: ledgerDefaults.ackQuorum must be <= ledgerDefaults.writeQuorum"]
    missing = check("examples/no-such-file.yaml")
    assert missing.returncode == 1 and "cannot read" in missing.stderr


def test_check_takes_bookielogs_too(child_processes):
    ok = check("examples/bookielog.yaml")
    assert ok.returncode == 0 and "valid" in ok.stdout, ok.stderr
    bad = check("examples/bookielog-invalid-ack-above-write.yaml")
    assert bad.returncode == 1
    assert "invalid BookieLog" in bad.stderr and "replication.ackQuorum must be <= replication.writeQuorum" in bad.stderr
