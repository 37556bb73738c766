"""`pybk shell top`: the live view shows what the bookies' own metrics and etcd say."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading

import pytest

from pybk.shell.top import BookieState, Sample, bookie_row, bucket_quantile, frame, parse_sample

PASSWORD = b"top-test"


def _top(uri: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pybk.cli", "shell", "top", "--metadata-uri", uri, *args],
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def test_fsync_quantile_interpolates_within_its_bucket_as_prometheus_does():
    buckets = [(0.001, 50.0), (0.002, 90.0), (0.005, 100.0), (float("inf"), 100.0)]
    assert bucket_quantile(0.5, buckets) == pytest.approx(0.001)
    assert bucket_quantile(0.7, buckets) == pytest.approx(0.0015)
    assert bucket_quantile(0.99, buckets) == pytest.approx(0.002 + 0.003 * 0.9)
    assert bucket_quantile(0.99, [(0.001, 0.0), (float("inf"), 0.0)]) is None
    assert bucket_quantile(0.99, [(0.001, 1.0), (float("inf"), 10.0)]) == 0.001


def test_rates_are_taken_between_two_scrapes_and_not_across_a_restart():
    prev = Sample(10.0, {"adds": 100.0, "add_bytes": 1024.0, "add_errors": 1.0}, {},
                  ((0.001, 10.0), (0.002, 10.0), (float("inf"), 10.0)))
    cur = Sample(12.0, {"adds": 300.0, "add_bytes": 5120.0, "add_errors": 5.0}, {"read_only": 0.0},
                 ((0.001, 10.0), (0.002, 20.0), (float("inf"), 20.0)))
    row = bookie_row("b1", BookieState.WRITABLE, cur, prev)
    assert row["adds_per_second"] == 100.0
    assert row["add_bytes_per_second"] == 2048.0
    assert row["errors_per_second"] == 2.0
    assert row["journal_fsync_p99_seconds"] == pytest.approx(0.001 + 0.001 * 0.99)
    restarted = Sample(14.0, {"adds": 3.0}, {}, ())
    assert bookie_row("b1", BookieState.WRITABLE, restarted, cur)["adds_per_second"] is None
    assert bookie_row("b1", BookieState.WRITABLE, cur, None)["adds"] == 300.0


def test_frame_counts_bookies_by_state_and_ages_the_oldest_under_replicated_ledger():
    s = Sample(1.0, {"adds": 1.0}, {"read_only": 1.0})
    f = frame(100_000, {"a": BookieState.WRITABLE, "b": BookieState.READONLY, "c": BookieState.WRITABLE},
              {"a": s, "b": s, "c": None}, {}, [{"since_ms": 40_000}, {"since_ms": 90_000}], "a")
    assert f["bookies"] == {"writable": 0, "readonly": 2, "unreachable": 1}
    assert [r["state"] for r in f["rows"]] == ["readonly", "readonly", "unreachable"]
    assert f["under_replicated"] == {"ledgers": 2, "oldest_seconds": 60.0}
    assert f["auditor"] == "a"


def test_parse_sample_reads_a_real_bookies_metrics(bookies):
    (b,) = bookies(1)
    status, body = b.http_get("/metrics")
    assert status == 200
    s = parse_sample(body.decode(), 1.0)
    assert s.counters["adds"] == 0.0
    assert s.gauges["read_only"] == 0.0
    assert s.fsync_buckets and s.fsync_buckets[-1][0] == float("inf")


def test_top_shows_every_bookie_its_state_and_the_adds_it_took(bookies, metadata_uri):
    from pybk.client.sync import BookKeeper
    procs = bookies(3)
    entries = 40
    with BookKeeper.connect(metadata_uri) as bk:
        lh = bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=3, password=PASSWORD)
        for i in range(entries):
            lh.add_entry(b"e%d" % i)
        lh.close()
        procs[2].http_json("/api/v1/bookie/state/readonly", "PUT", {"readOnly": True})
        stop = threading.Event()

        def keep_writing() -> None:
            w = bk.create_ledger(ensemble=2, write_quorum=2, ack_quorum=2, password=PASSWORD)
            while not stop.is_set():
                w.add_entry(b"more")
            w.close()
        writer = threading.Thread(target=keep_writing)
        writer.start()
        try:
            res = _top(metadata_uri, "--count", "2", "--interval", "1", "-o", "json")
        finally:
            stop.set()
            writer.join(60)
    assert res.returncode == 0, res.stderr
    frames = [json.loads(line) for line in res.stdout.splitlines()]
    assert len(frames) == 2
    rows = {r["bookie"]: r for r in frames[1]["rows"]}
    assert set(rows) == {p.bookie_id for p in procs}
    assert rows[procs[2].bookie_id]["state"] == "readonly"
    assert frames[1]["bookies"] == {"writable": 2, "readonly": 1, "unreachable": 0}
    for p in procs:
        assert rows[p.bookie_id]["adds"] >= entries
    assert frames[0]["totals"]["adds_per_second"] is None  # no earlier scrape to take a rate from
    assert frames[1]["totals"]["adds_per_second"] > 0
    assert rows[procs[0].bookie_id]["journal_fsync_p99_seconds"] > 0


def test_top_shows_a_registered_bookie_that_does_not_answer_as_unreachable(bookies, metadata_uri):
    procs = bookies(2)
    procs[1].signal(signal.SIGSTOP)  # still registered (its lease outlives the scrape timeout), answers nothing
    try:
        res = _top(metadata_uri, "--count", "1", "-o", "json")
    finally:
        procs[1].signal(signal.SIGCONT)
    assert res.returncode == 0, res.stderr
    rows = {r["bookie"]: r for r in json.loads(res.stdout)["rows"]}
    assert rows[procs[1].bookie_id]["state"] == "unreachable"
    assert rows[procs[0].bookie_id]["state"] == "writable"


def test_top_text_is_a_summary_and_a_table(bookies, metadata_uri):
    procs = bookies(1)
    res = _top(metadata_uri, "--count", "1")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("pybk top ") and "1 writable" in lines[0]
    assert "under-replicated ledgers: 0" in lines[1]
    assert lines[3].split()[:2] == ["BOOKIE", "STATE"]
    assert lines[4].split()[:2] == [procs[0].bookie_id, "writable"]


def test_top_refuses_a_non_positive_interval_naming_it(metadata_uri):
    res = _top(metadata_uri, "--interval", "0", "--count", "1")
    assert res.returncode == 1
    assert res.stderr.splitlines()[0] == "pybk shell top: error: --interval must be positive, not 0.0"
