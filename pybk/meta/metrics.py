"""Prometheus metrics of the metadata client, in the process-wide registry: every pybk process
that talks to etcd (bookie, autorecovery, operator, clients) counts the same way."""
from __future__ import annotations

from prometheus_client import Counter

ETCD_ERRORS = Counter("pybk_etcd_errors", "etcd calls that failed, by gRPC status code (UNAVAILABLE and "
                      "DEADLINE_EXCEEDED: etcd unreachable or slow; PERMISSION_DENIED, UNAUTHENTICATED: "
                      "credentials)", ["code"])
