"""`pybk bench floor` runs its bare servers, answers every message and cleans up."""
from __future__ import annotations

import json
import subprocess
import sys


def test_floor_bench_reports_latency_for_every_message_and_leaves_no_server(tmp_path):
    out = subprocess.run([sys.executable, "-m", "pybk.cli", "bench", "floor", "--entries", "50", "--dir",
                          str(tmp_path), "-o", "json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["entries"] == 50 and result["servers"] == 3 and result["ack_quorum"] == 2
    assert 0 < result["p50_ms"] <= result["p99_ms"]
    assert list(tmp_path.iterdir()) == []  # the temp dir with the servers' files is gone


def test_floor_bench_refuses_an_impossible_quorum():
    out = subprocess.run([sys.executable, "-m", "pybk.cli", "bench", "floor", "--ack-quorum", "4"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--ack-quorum" in out.stderr
