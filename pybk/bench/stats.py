"""Measurement helpers shared by the benchmarks: percentiles and process CPU time."""
from __future__ import annotations

import os
from pathlib import Path


def percentile(sorted_values: list[float], q: float) -> float:
    """The q-quantile (0..1) of already sorted values; 0.0 when there are none."""
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))] if sorted_values else 0.0


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of processes (Linux /proc), threads included."""
    total = 0.0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total
