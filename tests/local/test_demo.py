"""`make demo` (python -m pybk.demo) runs end to end and leaves no process behind."""
from __future__ import annotations

import re
import subprocess
import sys

from pybk.local import control


def test_demo_runs_end_to_end_and_stops_its_cluster(tmp_path, child_processes):
    data_dir = tmp_path / "demo"
    # the Spark step is left out here: a local[2] session is slow to start on a loaded machine,
    # and tests/spark covers the statistics job itself
    res = subprocess.run([sys.executable, "-m", "pybk.demo", "--data-dir", str(data_dir), "--no-spark"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "demo finished: every acked event was read back identical." in res.stdout
    assert "bookie-2  writable" in res.stdout and "CLOSED  3/3/2" in res.stdout
    stopped = next(line for line in res.stdout.splitlines() if "stopped the local cluster" in line)
    pids = [int(p) for p in re.findall(r"pid (\d+)", stopped)]
    assert len(pids) == 6  # supervisor, etcd, 3 bookies, autorecovery
    assert [p for p in pids if control.pid_alive(p)] == []
    assert control.running_supervisor(data_dir) is None and not (data_dir / "local.json").exists()


def test_demo_without_java_skips_spark_naming_the_package(monkeypatch, tmp_path, capsys):
    from pybk import demo
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-java"))
    note = demo.spark_stats("etcd://127.0.0.1:1/pybk", {})
    assert note.startswith("skipped:") and "apt-get install -y openjdk-17-jre-headless" in note
    assert "apt-get install" in capsys.readouterr().out


def test_demo_runs_unchanged_on_a_secured_cluster(tmp_path, child_processes):
    data_dir = tmp_path / "demo"
    res = subprocess.run([sys.executable, "-m", "pybk.demo", "--data-dir", str(data_dir), "--no-spark", "--secure"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "pybk local up -f" in res.stdout and "--secure" in res.stdout
    assert "demo finished: every acked event was read back identical." in res.stdout
    assert "bookie-2  writable" in res.stdout and "CLOSED  3/3/2" in res.stdout
    assert (data_dir / "security" / "secure.json").exists()
