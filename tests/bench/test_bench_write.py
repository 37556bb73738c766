"""`pybk bench write` and its JetStream peer: real nats-server processes, real etcd and bookies,
small counts (the figures themselves are never asserted: benchmarks are not timed tests)."""
from __future__ import annotations

import json
import statistics
import subprocess
import sys

from pybk.bench.peer_nats import NAME, run_jetstream


def bench_write(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pybk.cli", "bench", "write", *args],
                          capture_output=True, text=True, timeout=timeout)


def test_jetstream_runner_acks_every_message_it_was_asked_for_and_cleans_up(tmp_path, child_processes):
    results = run_jetstream([(64, 300), (1, 40)], 512, str(tmp_path))
    assert [(r["run"], r["window"], r["entries"], r["size"]) for r in results] == [
        (f"{NAME} window=64", 64, 300, 512), (f"{NAME} window=1", 1, 40, 512)]
    for r in results:
        assert r["entries_per_s"] > 0 and 0 < r["p50_ms"] <= r["p99_ms"] <= r["p999_ms"]
        assert r["client_cpu_us_per_entry"] > 0 and r["servers_cpu_us_per_entry"] >= 0
        # the servers hold every message: each run's warm-up (as many as measured here) and its run
        assert r["stream_messages"] == 2 * (300 + 40)
    assert list(tmp_path.iterdir()) == []  # the servers' store dirs are gone with the servers


def test_peer_pairs_print_each_pair_the_medians_and_the_ratios(tmp_path, child_processes):
    out = bench_write("--peer-nats", "--repeat", "2", "--entries", "400", "--window1-entries", "30",
                      "--dir", str(tmp_path), "-o", "json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["command"].endswith("bench write --peer-nats --repeat 2 --entries 400 --window1-entries 30 "
                                      f"--dir {tmp_path} -o json")
    assert result["repeat"] == 2 and [p["pair"] for p in result["pairs"]] == [1, 2]
    runs = ["pybk E3/Qw3/Qa2 window=256", "pybk E3/Qw3/Qa2 window=1", f"{NAME} window=256", f"{NAME} window=1",
            "pybk / JetStream window=256", "pybk / JetStream window=1"]
    for pair in result["pairs"]:
        rows = {r["run"]: r for r in pair["results"]}
        assert list(rows) == runs
        assert [rows[n]["entries"] for n in runs[:4]] == [400, 30, 400, 30]
        assert "bookies_cpu_us_per_entry" in rows[runs[0]] and "servers_cpu_us_per_entry" in rows[runs[2]]
        for window in (256, 1):
            ratio = rows[f"pybk / JetStream window={window}"]
            pybk, peer = rows[f"pybk E3/Qw3/Qa2 window={window}"], rows[f"{NAME} window={window}"]
            assert ratio["throughput_ratio"] == round(pybk["entries_per_s"] / peer["entries_per_s"], 3)
            assert ratio["p50_ratio"] == round(pybk["p50_ms"] / peer["p50_ms"], 3)
    medians = {r["run"]: r for r in result["medians"]}
    assert list(medians) == runs
    for name in runs[:4]:
        assert medians[name]["pairs"] == 2
        assert medians[name]["entries_per_s"] == round(statistics.median(
            next(r for r in p["results"] if r["run"] == name)["entries_per_s"] for p in result["pairs"]), 3)
    assert [r["run"] for r in result["ratios"]] == runs[4:]
    for ratio in result["ratios"]:
        each = [next(r for r in p["results"] if r["run"] == ratio["run"])["throughput_ratio"]
                for p in result["pairs"]]
        assert ratio["throughput_ratios"] == each
        assert ratio["throughput_ratio"] == round(statistics.median(each), 3)
    assert list(tmp_path.iterdir()) == []


def test_repeated_rounds_print_each_round_then_medians_and_the_command(tmp_path, child_processes):
    out = bench_write("--peer-nats", "--repeat", "2", "--windows", "1", "--window1-entries", "20",
                      "--dir", str(tmp_path))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    heads = [ln for ln in lines if not ln.startswith("  ")]
    assert heads == ["pair 1 of 2:", "pair 2 of 2:", "medians of 2 pairs:", "ratios, medians of the pairs:",
                     f"command: pybk bench write --peer-nats --repeat 2 --windows 1 --window1-entries 20 "
                     f"--dir {tmp_path}"]
    ratio = lines[lines.index("ratios, medians of the pairs:") + 1]
    assert ratio.startswith("  pybk / JetStream window=1: entries/s ") and ratio.count("(pairs: ") == 2
    assert sum(ln.startswith(f"  {NAME} window=1: 20 entries of 1024 B") for ln in lines) == 3


def test_peer_without_the_bench_extra_names_the_missing_package_and_the_install():
    # nats-py made unimportable, as when it is not installed
    blocked = ("import sys; sys.modules['nats'] = None; sys.argv = ['pybk', 'bench', 'write', '--peer-nats']; "
               "from pybk.cli import main; sys.exit(main())")
    out = subprocess.run([sys.executable, "-c", blocked], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and out.stdout == ""
    first = out.stderr.splitlines()[0]
    assert first == ("pybk bench write: error: the bench extra is not installed: no nats-py package "
                     "(pip install 'pybk[bench]')")
