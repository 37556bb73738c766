"""The bookie's Prometheus metrics, in a registry of its own (served at /metrics)."""
from __future__ import annotations

import asyncio
import enum
import logging
from typing import Callable, Collection, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


log = logging.getLogger("pybk.bookie.metrics")

LOOP_LAG_INTERVAL = 0.1  # seconds between event loop lag samples
LOOP_LAG_WARNING = 1.0   # a lag this long is logged as well
LATENCY_BUCKETS = (.0002, .0005, .001, .002, .005, .01, .02, .05, .1, .25, .5, 1, 2.5, 5)


class Metrics:
    """Counters are bumped once per batch, never per entry, to keep the hot path cheap."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.adds = Counter("pybk_bookie_adds", "entries added (acknowledged OK)", registry=r)
        self.add_errors = Counter("pybk_bookie_add_errors", "adds refused, by status", ["status"], registry=r)
        self.add_bytes = Counter("pybk_bookie_add_bytes", "bytes of entry bodies added", registry=r)
        self.reads = Counter("pybk_bookie_reads", "entries read and returned", registry=r)
        self.read_requests = Counter("pybk_bookie_read_requests", "entry reads (Read RPCs for a range, "
                                     "one entry or many) received", registry=r)
        self.read_bytes = Counter("pybk_bookie_read_bytes", "bytes of entry bodies returned by reads", registry=r)
        self.denied = Counter("pybk_bookie_denied_requests", "requests refused by authentication or "
                              "authorization, by operation and gRPC code (UNAUTHENTICATED, PERMISSION_DENIED)",
                              ["operation", "code"], registry=r)
        self.read_errors = Counter("pybk_bookie_read_errors", "reads answered with an error, by status",
                                   ["status"], registry=r)
        self.add_batch_size = Histogram("pybk_bookie_add_batch_entries", "entries per Add batch received",
                                        buckets=(1, 4, 16, 64, 256, 1024, 4096, 16384), registry=r)
        self.journal_fsync = Histogram("pybk_bookie_journal_fsync_seconds",
                                       "journal group commit latency (write + fdatasync)",
                                       buckets=(.0001, .0002, .0005, .001, .002, .005, .01, .02, .05, .1, .5, 1),
                                       registry=r)
        self.journal_group = Histogram("pybk_bookie_journal_group_appends", "appends per journal group commit",
                                       buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256), registry=r)
        self.journal_bytes = Counter("pybk_bookie_journal_bytes", "bytes written to the journal", registry=r)
        self.write_cache_bytes = Gauge("pybk_bookie_write_cache_bytes", "bytes in the write cache", registry=r)
        self.write_cache_entries = Gauge("pybk_bookie_write_cache_entries", "entries in the write cache", registry=r)
        self.checkpoints = Counter("pybk_bookie_checkpoints", "checkpoints completed", registry=r)
        self.checkpoint_seconds = Histogram("pybk_bookie_checkpoint_seconds", "checkpoint duration", registry=r)
        self.read_only = Gauge("pybk_bookie_read_only", "1 when the bookie is read-only", registry=r)
        self.read_only_reason = Gauge("pybk_bookie_read_only_reason", "1 for each reason the bookie is "
                                      "read-only: disk (above the high-water mark or full), journal (a journal "
                                      "write failed), requested (admin API, decommission)", ["reason"], registry=r)
        self.grpc_errors = Counter("pybk_bookie_grpc_errors", "gRPC calls that ended with a status other than OK, "
                                   "by method and gRPC status code (CANCELLED: the caller went away or its "
                                   "deadline passed)", ["method", "code"], registry=r)
        self.disk_usage = Gauge("pybk_bookie_disk_usage_ratio", "used fraction of the bookie's disk", registry=r)
        self.ledgers = Gauge("pybk_bookie_ledgers", "ledgers known to this bookie", registry=r)
        self.scrub_runs = Counter("pybk_scrub_runs", "scrub runs finished (stopped early ones too)", registry=r)
        self.scrub_failures = Counter("pybk_scrub_failures", "scrub runs stopped early because the files could "
                                      "not be looked at (see the log)", registry=r)
        self.scrub_entries_checked = Counter("pybk_scrub_entries_checked", "index entries the scrubber checked "
                                             "against their entry-log records", registry=r)
        self.scrub_bad_entries = Counter("pybk_scrub_bad_entries", "entries found unreadable by the scrubber and "
                                         "dropped from the index (to be re-replicated)", registry=r)
        self.scrub_files_missing = Counter("pybk_scrub_files_missing", "entry log files the index points at "
                                           "that the scrubber found missing", registry=r)
        self.scrub_last_run = Gauge("pybk_scrub_last_run_timestamp_seconds", "when the last scrub run ended "
                                    "(Unix time)", registry=r)
        self.scrub_last_run_seconds = Gauge("pybk_scrub_last_run_duration_seconds", "how long the last scrub "
                                            "run took", registry=r)
        self.add_latency = Histogram("pybk_bookie_add_latency_seconds", "time from receiving an Add batch to "
                                     "answering it (journal synced), per batch", buckets=LATENCY_BUCKETS, registry=r)
        self.read_latency = Histogram("pybk_bookie_read_latency_seconds", "time to read and send the answers of "
                                      "a Read of one entry or a range", buckets=LATENCY_BUCKETS, registry=r)
        self.disk_total = Gauge("pybk_bookie_disk_total_bytes", "size of the disk (or disk_capacity budget) the "
                                "usage ratio is of", registry=r)
        self.disk_used = Gauge("pybk_bookie_disk_used_bytes", "bytes used on it (usage ratio x total)", registry=r)
        self.high_water_mark = Gauge("pybk_bookie_disk_high_water_mark_ratio", "disk usage at which the bookie "
                                     "turns read-only (high_water_mark)", registry=r)
        self.low_water_mark = Gauge("pybk_bookie_disk_low_water_mark_ratio", "disk usage below which it turns "
                                    "writable again (low_water_mark)", registry=r)
        self.gc_runs = Counter("pybk_bookie_gc_runs", "garbage collection rounds completed", registry=r)
        self.gc_deleted_ledgers = Counter("pybk_bookie_gc_deleted_ledgers", "ledgers dropped because they were "
                                          "deleted from the metadata", registry=r)
        self.gc_reclaimed_bytes = Counter("pybk_bookie_gc_reclaimed_bytes", "entry log bytes reclaimed by "
                                          "compaction", registry=r)
        self.gc_seconds = Histogram("pybk_bookie_gc_seconds", "garbage collection round duration",
                                    buckets=(.01, .1, .5, 1, 5, 15, 60, 300, 1800), registry=r)
        self.connections = Gauge("pybk_bookie_connections", "gRPC connections open now", registry=r)
        self.connection_limit = Gauge("pybk_bookie_connection_limit", "gRPC connections held at most (max_connections "
                                      "as the open-files limit allows)", registry=r)
        self.connections_refused = Counter("pybk_bookie_connections_refused", "gRPC connections closed as soon as "
                                           "accepted, by the limit they met: max_connections, "
                                           "max_connections_per_peer", ["reason"], registry=r)
        self.connections_closed = Counter("pybk_bookie_connections_closed", "gRPC connections the bookie ended, by "
                                          "reason: handshake_timeout (no TLS handshake and HTTP/2 preface in time), "
                                          "idle (no call for idle_timeout, GOAWAY), keepalive (no answer to a PING)",
                                          ["reason"], registry=r)
        for reason in ("max_connections", "max_connections_per_peer"):
            self.connections_refused.labels(reason)
        for reason in ("handshake_timeout", "idle", "keepalive"):
            self.connections_closed.labels(reason)
        self.loop_lag = Histogram("pybk_event_loop_lag_seconds", "how late the event loop ran a timer "
                                  "(time it was busy with other work)",
                                  buckets=(.001, .005, .01, .05, .1, .25, .5, 1, 2.5, 5, 10), registry=r)

    def explain_read_only(self, reasons: Iterable[enum.Enum], current: Callable[[], Collection[enum.Enum]]) -> None:
        """pybk_bookie_read_only_reason{reason}: 1 for each of `reasons` in current(), asked at
        scrape time, so a reason that comes or goes while the bookie stays read-only shows too."""
        for reason in reasons:
            self.read_only_reason.labels(reason.value).set_function(lambda r=reason: float(r in current()))

    def water_marks(self, high: float, low: float) -> None:
        self.high_water_mark.set(high)
        self.low_water_mark.set(low)

    def disk_measured(self, usage: float, total: int) -> None:
        self.disk_usage.set(usage)
        self.disk_total.set(total)
        self.disk_used.set(usage * total)

    def gc_collected(self, deleted_ledgers: int, reclaimed_bytes: int, seconds: float) -> None:
        self.gc_runs.inc()
        self.gc_deleted_ledgers.inc(deleted_ledgers)
        self.gc_reclaimed_bytes.inc(reclaimed_bytes)
        self.gc_seconds.observe(seconds)

    def journal_synced(self, seconds: float, nbytes: int, appends: int) -> None:
        self.journal_fsync.observe(seconds)
        self.journal_group.observe(appends)
        self.journal_bytes.inc(nbytes)

    async def watch_loop_lag(self, interval: float = LOOP_LAG_INTERVAL) -> None:
        """Run forever: sample how late a timer fires into pybk_event_loop_lag_seconds, and log a
        lag that could cost leases or client timeouts."""
        loop = asyncio.get_running_loop()
        while True:
            start = loop.time()
            await asyncio.sleep(interval)
            lag = max(loop.time() - start - interval, 0.0)
            self.loop_lag.observe(lag)
            if lag >= LOOP_LAG_WARNING:
                log.warning("the event loop was busy for %.1fs", lag)
