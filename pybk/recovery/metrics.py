"""Prometheus metrics of autorecovery. They join the process-wide registry (served at /metrics by
`pybk autorecovery`, and by a bookie that runs autorecovery inside) only once an AutoRecovery is
made, so a bookie without autorecovery does not report recovery figures it never saw."""
from __future__ import annotations

import time

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

UNDER_REPLICATED = Gauge("pybk_recovery_under_replicated_ledgers",
                         "ledgers marked under-replicated, as last seen by this process", registry=None)
BYTES_REPLICATED = Counter("pybk_recovery_bytes_replicated",
                           "entry bytes copied to replacement bookies by replication workers", registry=None)
ENTRIES_REPLICATED = Counter("pybk_recovery_entries_replicated",
                             "entries copied to replacement bookies by replication workers", registry=None)
LEDGERS_REPLICATED = Counter("pybk_recovery_ledgers_replicated",
                             "under-replication markers finished (ledger fully replicated again)", registry=None)
AUDIT_SECONDS = Histogram("pybk_recovery_audit_seconds", "duration of a full periodic check",
                          buckets=(0.1, 0.5, 1, 5, 15, 60, 300, 1800, 7200), registry=None)
LOST_BOOKIES = Gauge("pybk_recovery_lost_bookies", "bookies gone longer than the lost-bookie delay", registry=None)
PLACEMENT_VIOLATIONS = Gauge("pybk_recovery_placement_violations",
                             "fragments whose ensemble spans fewer zones than it could (last audit)", registry=None)
IS_AUDITOR = Gauge("pybk_recovery_is_auditor", "1 while this process is the elected auditor", registry=None)
OLDEST_UNDER_REPLICATED = Gauge("pybk_recovery_oldest_under_replicated_age_seconds",
                                "age of the oldest under-replication marker (0: none) this process's "
                                "replication worker last saw, at scrape time", registry=None)
LAST_AUDIT = Gauge("pybk_recovery_last_audit_timestamp_seconds",
                   "when this process last finished a full periodic check (Unix time; 0: never)", registry=None)
DECOMMISSION_TOTAL = Gauge("pybk_recovery_decommission_ledgers", "ledgers that referenced a bookie being "
                           "decommissioned when its drain began (elected auditor only)", ["bookie"], registry=None)
DECOMMISSION_REMAINING = Gauge("pybk_recovery_decommission_remaining_ledgers", "ledgers that still reference "
                               "a bookie being decommissioned (elected auditor only)", ["bookie"], registry=None)
REPLICATION_FAILURES = Counter("pybk_recovery_replication_failures",
                               "ledger replication attempts that failed and will be retried", registry=None)

_registered = False
_oldest_since: float | None = None  # Unix time of the oldest marker the worker last saw


def register() -> None:
    """Put every metric of this module into the process-wide registry (once; AutoRecovery calls it)."""
    global _registered
    if not _registered:
        for metric in [v for v in globals().values() if isinstance(v, MetricWrapperBase)]:
            REGISTRY.register(metric)
        _registered = True


def under_replicated_seen(count: int, oldest_since: float | None) -> None:
    """A replication pass saw `count` markers, the oldest placed at `oldest_since` (Unix time;
    None: no marker). The oldest one's age is worked out at scrape time, so it keeps growing while
    a long pass runs instead of standing still at the pass's start."""
    global _oldest_since
    UNDER_REPLICATED.set(count)
    _oldest_since = oldest_since


def _oldest_age() -> float:
    return max(0.0, time.time() - _oldest_since) if _oldest_since is not None else 0.0


OLDEST_UNDER_REPLICATED.set_function(_oldest_age)
