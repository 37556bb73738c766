"""`pybk bench log`: real etcd, bookies, writer processes killed with -9 and nats-servers, small
counts (the figures themselves are never asserted: benchmarks are not timed tests)."""
from __future__ import annotations

import json
import statistics
import subprocess
import sys

from pybk.bench.peer_nats import NAME


def test_rounds_print_every_run_the_medians_the_ratios_and_the_goals(tmp_path, child_processes):
    """Slow: two rounds, each a local cluster, two killed writer processes and a JetStream cluster."""
    out = subprocess.run([sys.executable, "-m", "pybk.cli", "bench", "log", "--peer-nats", "--repeat", "2",
                          "--records", "3000", "--many-records", "20000", "--kib-records", "1000",
                          "--latency-records", "100", "--takeovers", "2", "--segments", "600",
                          "--dir", str(tmp_path), "-o", "json"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["command"].endswith(f"bench log --peer-nats --repeat 2 --records 3000 --many-records 20000 "
                                      f"--kib-records 1000 --latency-records 100 --takeovers 2 --segments 600 "
                                      f"--dir {tmp_path} -o json")
    assert result["repeat"] == 2 and len(result["rounds"]) == 2 and result["load_before"] >= 0
    runs = ["log 100 B pipelined", "log 100 B append_many", "log 1 KiB pipelined", "pybk E3/Qw3/Qa2 window=256",
            "pybk E3/Qw3/Qa2 window=1 100 B", "log end-to-end append -> tailing reader at 1000/s",
            "log end-to-end at 1000/s, linger 0, explicit LAC 1 ms",
            "log forced takeover: open_writer -> first ack", "log etcd bytes per idle log",
            "log open of 600 segments", f"{NAME} window=1024", "log 1 KiB / ledger window=256",
            "log 100 B pipelined / JetStream", "log 100 B append_many / JetStream"]
    for rnd in result["rounds"]:
        rows = {r["run"]: r for r in rnd["results"]}
        assert list(rows) == runs
        assert [rows[n]["entries"] for n in runs[:6]] == [3000, 20000, 1000, 1000, 100, 100]
        assert rows[runs[10]]["entries"] == 3000 and rows[runs[10]]["size"] == 100
        assert rows["log forced takeover: open_writer -> first ack"]["takeovers"] == 2
        assert 0 < rows["log etcd bytes per idle log"]["bytes"] < 4096
        jet = rows["log 100 B pipelined / JetStream"]
        assert jet["throughput_ratio"] == round(rows[runs[0]]["entries_per_s"] / rows[runs[10]]["entries_per_s"], 3)
        kib = rows["log 1 KiB / ledger window=256"]
        assert kib["throughput_ratio"] == round(rows[runs[2]]["entries_per_s"] / rows[runs[3]]["entries_per_s"], 3)
    medians = {r["run"]: r for r in result["medians"]}
    assert list(medians) == runs
    assert medians[runs[0]]["entries_per_s"] == round(statistics.median(
        next(r for r in rnd["results"] if r["run"] == runs[0])["entries_per_s"] for rnd in result["rounds"]), 3)
    assert len(result["goals"]) == 8 and all(g.endswith((": met", ": MISSED")) for g in result["goals"])
    assert list(tmp_path.iterdir()) == []   # the clusters' files are gone with them


def test_only_runs_the_measurements_named_and_checks_their_goals_alone(tmp_path, child_processes):
    out = subprocess.run([sys.executable, "-m", "pybk.cli", "bench", "log", "--only", "etcd", "--only", "segments",
                          "--segments", "300", "--peer-nats", "--dir", str(tmp_path), "-o", "json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    rows = [r["run"] for r in result["rounds"][0]["results"]]
    assert rows == ["log etcd bytes per idle log", "log open of 300 segments"]   # no JetStream: its peers did not run
    assert len(result["goals"]) == 2 and result["goals"][0].startswith("etcd bytes per idle log")
    bad = subprocess.run([sys.executable, "-m", "pybk.cli", "bench", "log", "--only", "everything"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "invalid choice: 'everything'" in bad.stderr
