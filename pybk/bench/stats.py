"""Measurement helpers shared by the benchmarks: percentiles and process CPU time."""
from __future__ import annotations

import os
from pathlib import Path


def percentile(sorted_values: list[float], q: float) -> float:
    """The q-quantile (0..1) of already sorted values; 0.0 when there are none."""
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))] if sorted_values else 0.0


def by_run(rounds: list[list[dict]]) -> dict[str, list[dict]]:
    """Each round's result rows grouped by their run name, in first-seen order (for the medians)."""
    groups: dict[str, list[dict]] = {}
    for results in rounds:
        for r in results:
            groups.setdefault(r["run"], []).append(r)
    return groups


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of processes (Linux /proc), threads included."""
    total = 0.0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def summary(name: str, n: int, size: int, seconds: float, latencies: list[float], **extra) -> dict:
    """One run's figures: n entries of size bytes in seconds, latency percentiles in ms; extra
    fields are appended."""
    latencies = sorted(latencies)
    return {"run": name, "entries": n, "size": size, "seconds": round(seconds, 3),
            "entries_per_s": round(n / seconds, 1), "mb_per_s": round(n * size / seconds / 1e6, 2),
            "p50_ms": round(percentile(latencies, 0.5) * 1000, 3),
            "p99_ms": round(percentile(latencies, 0.99) * 1000, 3),
            "p999_ms": round(percentile(latencies, 0.999) * 1000, 3), **extra}


def warmup(n: int, window: int) -> tuple[int, int]:
    """(entries, window) of the warm-up before measuring n entries at window, for pybk and its
    peer alike: min(2000, n) entries at most 256 in flight, so that connections, caches and
    leaders have settled."""
    return min(2000, n), min(window, 256)
