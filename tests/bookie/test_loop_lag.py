"""The bookie's event-loop lag monitor (pybk.bookie.metrics.Metrics.watch_loop_lag): how late its
timer fires is a histogram, and the longest lag since start a gauge, so one stall shows exactly
(the attack tests bound it) however many short samples surround it."""
from __future__ import annotations

import asyncio
import time

from pybk.bookie.metrics import Metrics
from polling import eventually
from procfs import favoured


def value(metrics: Metrics, name: str, labels: dict | None = None) -> float:
    return metrics.registry.get_sample_value(name, labels or {}) or 0.0


async def test_a_stall_sets_the_longest_lag_and_a_histogram_sample():
    metrics = Metrics()
    watch = asyncio.ensure_future(metrics.watch_loop_lag(interval=0.01))
    try:
        async with favoured():  # one stall and no other: the loop's lag in wall time is this test's alone
            await eventually(lambda: value(metrics, "pybk_event_loop_lag_seconds_count") >= 3, 5, interval=0.01,
                             what="the first samples")
            time.sleep(0.3)  # the loop blocked, as by a long callback
            await eventually(lambda: value(metrics, "pybk_event_loop_lag_max_seconds") >= 0.25, 5, interval=0.01,
                             what="the stall in the gauge")
            longest = value(metrics, "pybk_event_loop_lag_max_seconds")
            assert longest < 1.0
            count = value(metrics, "pybk_event_loop_lag_seconds_count")
            assert count - value(metrics, "pybk_event_loop_lag_seconds_bucket", {"le": "0.2"}) == 1
            await eventually(lambda: value(metrics, "pybk_event_loop_lag_seconds_count") >= count + 5, 5, interval=0.01,
                             what="samples after the stall")
            assert value(metrics, "pybk_event_loop_lag_max_seconds") == longest  # shorter lags leave it
    finally:
        watch.cancel()
