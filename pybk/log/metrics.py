"""Prometheus metrics of named logs, labelled by log with a bounded number of label values.

Two groups:
- the writer's, in the process that appends (any application using pybk.log; in the default
  registry, served by whatever /metrics the application has): records, bytes and entries
  appended, how full entries were sent, rolls and fencings;
- the retention service's, in the elected autorecovery process (registered only once it runs
  the service, as autorecovery's own metrics are): segments and bytes deleted by retention,
  idle segments rolled, each log's end offset (so records/s is known even of writers that
  export nothing) and its slowest cursor's lag.

The `log` label takes a log's name for the first `max_labelled_logs()` logs a process sees
(`PYBK_LOG_METRICS_MAX_LOGS`, default 100) and `OTHER` for every later one, so a cluster of a
million logs costs a bounded number of series.
"""
from __future__ import annotations

import os
import threading

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

OTHER = "_other"
ENV_MAX_LOGS = "PYBK_LOG_METRICS_MAX_LOGS"
DEFAULT_MAX_LOGS = 100

APPENDED_RECORDS = Counter("pybk_log_appended_records", "records appended and acknowledged, by log", ["log"])
APPENDED_BYTES = Counter("pybk_log_appended_bytes", "bytes of entries acknowledged (records and their headers), "
                         "by log", ["log"])
ENTRIES = Counter("pybk_log_entries", "entries (batches of records) acknowledged, by log", ["log"])
BATCH_FILL = Histogram("pybk_log_batch_fill_ratio", "an entry's size when sent over the writer's batch_bytes "
                       "(1: sent full; small: sent by the linger)",
                       buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0))
ROLLS = Counter("pybk_log_rolls", "segments rolled by writers, by log", ["log"])
FENCINGS = Counter("pybk_log_fencings", "writers that stopped because a newer writer took the log over, by log",
                   ["log"])

RETENTION_DELETED_SEGMENTS = Counter("pybk_log_retention_deleted_segments",
                                     "segments deleted by retention (autorecovery's retention service), by log",
                                     ["log"], registry=None)
RETENTION_DELETED_BYTES = Counter("pybk_log_retention_deleted_bytes",
                                  "bytes of the segments deleted by retention, by log", ["log"], registry=None)
IDLE_ROLLS = Counter("pybk_log_retention_idle_rolls",
                     "OPEN segments of logs without a live writer sealed so that their age counts, by log",
                     ["log"], registry=None)
END_OFFSET = Gauge("pybk_log_end_offset", "a log's end offset (records ever appended) at the last retention "
                   "pass; its rate is the log's records/s", ["log"], registry=None)
CURSOR_LAG = Gauge("pybk_log_cursor_lag_records", "records between a log's end and its slowest cursor at the "
                   "last retention pass", ["log"], registry=None)
LAST_PASS = Gauge("pybk_log_retention_last_pass_timestamp_seconds",
                  "when the retention service last finished a pass over every log (Unix time; 0: never)",
                  registry=None)
RETENTION_ERRORS = Counter("pybk_log_retention_errors", "logs whose retention step failed (retried next pass)",
                           registry=None)

_SERVICE = [RETENTION_DELETED_SEGMENTS, RETENTION_DELETED_BYTES, IDLE_ROLLS, END_OFFSET, CURSOR_LAG, LAST_PASS,
            RETENTION_ERRORS]


class LogLabels:
    """The `log` label value of each log: its name for the first `limit` names seen, else OTHER."""

    def __init__(self, limit: int | None = None):
        self.limit = limit
        self._named: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, name: str) -> str:
        if name in self._named:
            return name
        with self._lock:
            if len(self._named) < self._limit():
                self._named.add(name)
                return name
        return OTHER

    def _limit(self) -> int:
        if self.limit is not None:
            return self.limit
        try:
            return max(0, int(os.environ.get(ENV_MAX_LOGS, DEFAULT_MAX_LOGS)))
        except ValueError:
            return DEFAULT_MAX_LOGS

    @property
    def named(self) -> frozenset[str]:
        return frozenset(self._named)


label = LogLabels()
_registered = False


def register_service() -> None:
    """Put the retention service's metrics into the process-wide registry (once)."""
    global _registered
    if not _registered:
        for metric in _SERVICE:
            REGISTRY.register(metric)
        _registered = True


class WriterMetrics:
    """One writer's children of the writer metrics (resolved once: a writer's label never changes)."""

    __slots__ = ("records", "bytes", "entries", "rolls", "fencings")

    def __init__(self, log_name: str):
        value = label(log_name)
        self.records = APPENDED_RECORDS.labels(value)
        self.bytes = APPENDED_BYTES.labels(value)
        self.entries = ENTRIES.labels(value)
        self.rolls = ROLLS.labels(value)
        self.fencings = FENCINGS.labels(value)


def service_metrics() -> list[MetricWrapperBase]:
    return list(_SERVICE)
