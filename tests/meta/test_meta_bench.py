"""`pybk bench meta` runs end to end (tiny sizes; a smoke check, not a timed test)."""
import json
import subprocess
import sys

from pybk.meta.etcd import prefix_end


def pybk(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pybk.cli", *args], capture_output=True, text=True, timeout=300)


async def test_bench_meta_runs_against_given_etcd_and_cleans_up(etcd, store):
    done = pybk("bench", "meta", "--metadata-uri", etcd.metadata_uri("pybk"), "--cycles", "20", "--concurrency",
                "4", "--list-ledgers", "300", "--page-size", "100", "-o", "json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["create_close"]["cycles"] == 20 and result["list"]["ledgers"] == 300 + 20 + 2
    assert result["ledgers_fitting_default_quota"] > 0 and result["command"].startswith("pybk bench meta")
    left = await store.etcd.range(store.prefix, prefix_end(store.prefix), count_only=True)
    assert left.count == 0, "the benchmark deletes its keys"


def test_bench_meta_bad_uri_is_a_clear_error(child_processes):
    done = pybk("bench", "meta", "--metadata-uri", "etcd://h:1")
    assert done.returncode == 1 and "no key prefix" in done.stderr
