"""Prometheus metrics of autorecovery (default registry, so a bookie's /metrics shows them too)."""
from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

UNDER_REPLICATED = Gauge("pybk_recovery_under_replicated_ledgers",
                         "ledgers marked under-replicated, as last seen by this process")
BYTES_REPLICATED = Counter("pybk_recovery_bytes_replicated",
                           "entry bytes copied to replacement bookies by replication workers")
ENTRIES_REPLICATED = Counter("pybk_recovery_entries_replicated",
                             "entries copied to replacement bookies by replication workers")
LEDGERS_REPLICATED = Counter("pybk_recovery_ledgers_replicated",
                             "under-replication markers finished (ledger fully replicated again)")
AUDIT_SECONDS = Histogram("pybk_recovery_audit_seconds", "duration of a full periodic check",
                          buckets=(0.1, 0.5, 1, 5, 15, 60, 300, 1800, 7200))
LOST_BOOKIES = Gauge("pybk_recovery_lost_bookies", "bookies gone longer than the lost-bookie delay")
PLACEMENT_VIOLATIONS = Gauge("pybk_recovery_placement_violations",
                             "fragments whose ensemble spans fewer zones than it could (last audit)")
IS_AUDITOR = Gauge("pybk_recovery_is_auditor", "1 while this process is the elected auditor")
OLDEST_UNDER_REPLICATED = Gauge("pybk_recovery_oldest_under_replicated_age_seconds",
                                "age of the oldest under-replication marker (0: none), as last seen by this "
                                "process's replication worker")
LAST_AUDIT = Gauge("pybk_recovery_last_audit_timestamp_seconds",
                   "when this process last finished a full periodic check (Unix time; 0: never)")
DECOMMISSION_TOTAL = Gauge("pybk_recovery_decommission_ledgers", "ledgers that referenced a bookie being "
                           "decommissioned when its drain began (elected auditor only)", ["bookie"])
DECOMMISSION_REMAINING = Gauge("pybk_recovery_decommission_remaining_ledgers", "ledgers that still reference "
                               "a bookie being decommissioned (elected auditor only)", ["bookie"])
REPLICATION_FAILURES = Counter("pybk_recovery_replication_failures",
                               "ledger replication attempts that failed and will be retried")
