"""`pybk shell top`: a live terminal view of a cluster's key figures, for people without Grafana.

Every `--interval` seconds it reads the bookie registry, the under-replication markers and the
elected auditor from etcd, and scrapes each bookie's `/metrics` (with the shell's CA and token:
/metrics is open by default, for scrapers; a secured cluster that removes it from
`open_http_paths` asks for `reader`). Rates (adds/s, MiB/s, reads/s, errors/s)
and the journal fsync p99 are taken between two scrapes of the same bookie, so the first frame
shows totals only. The frame is computed by pure functions (`parse_sample`, `bookie_row`,
`frame`) from what was fetched; only `_scrape` and `_poll` do I/O.
"""
from __future__ import annotations

import argparse
import asyncio
import enum
import json
import math
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from prometheus_client.parser import text_string_to_metric_families

from .core import Shell, ShellError, command
from .format import format_table, human_bytes

SCRAPE_TIMEOUT = 5.0  # seconds one bookie's /metrics may take before it is shown unreachable

# counters summed over their labels, by the name the row gives them
COUNTERS = {
    "adds": "pybk_bookie_adds_total",
    "add_bytes": "pybk_bookie_add_bytes_total",
    "add_errors": "pybk_bookie_add_errors_total",
    "reads": "pybk_bookie_reads_total",
    "read_bytes": "pybk_bookie_read_bytes_total",
    "read_errors": "pybk_bookie_read_errors_total",
    "scrub_bad_entries": "pybk_scrub_bad_entries_total",
}
GAUGES = {
    "write_cache_bytes": "pybk_bookie_write_cache_bytes",
    "disk_usage_ratio": "pybk_bookie_disk_usage_ratio",
    "read_only": "pybk_bookie_read_only",
    "ledgers": "pybk_bookie_ledgers",
}
FSYNC_BUCKETS = "pybk_bookie_journal_fsync_seconds_bucket"


class BookieState(enum.StrEnum):
    """How a bookie shows in the view: as registered, or not answering its /metrics."""
    WRITABLE = "writable"
    READONLY = "readonly"
    UNREACHABLE = "unreachable"


@dataclass(frozen=True)
class Sample:
    """One scrape of one bookie's /metrics, at monotonic time `at`."""
    at: float
    counters: dict[str, float]
    gauges: dict[str, float]
    fsync_buckets: tuple[tuple[float, float], ...] = field(default=())  # (le, cumulative count), sorted


def parse_sample(text: str, at: float) -> Sample:
    """The figures the view shows from a Prometheus text exposition (names absent from it are
    left out, so a bookie of another version shows what it has)."""
    counters: dict[str, float] = {}
    gauges: dict[str, float] = {}
    buckets: dict[float, float] = {}
    by_counter = {v: k for k, v in COUNTERS.items()}
    by_gauge = {v: k for k, v in GAUGES.items()}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in by_counter:
                key = by_counter[s.name]
                counters[key] = counters.get(key, 0.0) + s.value
            elif s.name in by_gauge:
                gauges[by_gauge[s.name]] = s.value
            elif s.name == FSYNC_BUCKETS:
                le = float(s.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + s.value
    return Sample(at, counters, gauges, tuple(sorted(buckets.items())))


def bucket_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float | None:
    """The q-quantile of a cumulative histogram (le, count) as Prometheus' histogram_quantile
    computes it: linear within the bucket that holds it; None without observations. A quantile in
    the +Inf bucket is the highest finite bound."""
    bs = sorted(buckets)
    if not bs or bs[-1][1] <= 0:
        return None
    rank = q * bs[-1][1]
    prev_le, prev_count = 0.0, 0.0
    for le, count in bs:
        if count >= rank:
            if math.isinf(le):
                return prev_le
            if count == prev_count:
                return le
            return prev_le + (le - prev_le) * (rank - prev_count) / (count - prev_count)
        prev_le, prev_count = le, count
    return prev_le


def _delta_buckets(prev: Sample, cur: Sample) -> list[tuple[float, float]]:
    before = dict(prev.fsync_buckets)
    return [(le, max(count - before.get(le, 0.0), 0.0)) for le, count in cur.fsync_buckets]


def bookie_row(bookie_id: str, state: BookieState, cur: Sample | None, prev: Sample | None) -> dict[str, Any]:
    """One bookie's line: its totals and gauges from `cur`, and rates over the interval since
    `prev` (None when there is no earlier scrape, or a counter went back: the bookie restarted)."""
    row: dict[str, Any] = {"bookie": bookie_id, "state": str(state)}
    if cur is None:
        return row
    if cur.gauges.get("read_only") == 1 and state is BookieState.WRITABLE:
        row["state"] = str(BookieState.READONLY)
    row.update({k: cur.counters[k] for k in COUNTERS if k in cur.counters})
    row.update({k: cur.gauges[k] for k in ("write_cache_bytes", "disk_usage_ratio", "ledgers") if k in cur.gauges})
    rates: dict[str, float | None] = {"adds_per_second": None, "add_bytes_per_second": None,
                                      "reads_per_second": None, "errors_per_second": None}
    fsync_p99 = None
    elapsed = cur.at - prev.at if prev is not None else 0.0
    if prev is not None and elapsed > 0 and all(cur.counters.get(k, 0) >= prev.counters.get(k, 0)
                                                 for k in cur.counters):
        def rate(*keys: str) -> float:
            return sum(cur.counters.get(k, 0.0) - prev.counters.get(k, 0.0) for k in keys) / elapsed
        rates = {"adds_per_second": rate("adds"), "add_bytes_per_second": rate("add_bytes"),
                 "reads_per_second": rate("reads"), "errors_per_second": rate("add_errors", "read_errors")}
        fsync_p99 = bucket_quantile(0.99, _delta_buckets(prev, cur))
    row.update(rates)
    row["journal_fsync_p99_seconds"] = fsync_p99
    return row


def frame(now_ms: int, registered: Mapping[str, BookieState], samples: Mapping[str, Sample | None],
          previous: Mapping[str, Sample | None], markers: Iterable[Mapping[str, Any]],
          auditor: str | None) -> dict[str, Any]:
    """The whole view at one moment: a row per registered bookie, counts by state, the cluster's
    add and read rates, and the under-replicated ledgers (how many, the oldest's age)."""
    rows = []
    for bookie_id in sorted(registered):
        sample = samples.get(bookie_id)
        state = registered[bookie_id] if sample is not None else BookieState.UNREACHABLE
        rows.append(bookie_row(bookie_id, state, sample, previous.get(bookie_id)))
    counts = {str(s): sum(1 for r in rows if r["state"] == s) for s in BookieState}
    since = [int(m["since_ms"]) for m in markers]
    totals = {k: (sum(r[k] for r in rows if r.get(k) is not None)
                  if any(r.get(k) is not None for r in rows) else None)
              for k in ("adds_per_second", "add_bytes_per_second", "reads_per_second", "errors_per_second")}
    return {
        "time_ms": now_ms,
        "bookies": counts,
        "totals": totals,
        "under_replicated": {"ledgers": len(since),
                             "oldest_seconds": max(0.0, (now_ms - min(since)) / 1000) if since else None},
        "auditor": auditor,
        "rows": rows,
    }


def log_rows(ends: Mapping[str, int | None], previous: Mapping[str, int | None], elapsed: float | None,
             limit: int) -> list[dict[str, Any]]:
    """The busiest logs: each log's end offset now and its records/s since the previous frame
    (None on the first frame, or for a log whose end could not be read), the `limit` fastest
    first (then the longest; unknown figures last)."""
    rows = []
    for name, end in ends.items():
        before = previous.get(name)
        rate = ((end - before) / elapsed if end is not None and before is not None and elapsed and end >= before
                else None)
        rows.append({"log": name, "end_offset": end, "records_per_second": rate})
    rows.sort(key=lambda r: (r["records_per_second"] is None, -(r["records_per_second"] or 0.0),
                             r["end_offset"] is None, -(r["end_offset"] or 0), r["log"]))
    return rows[:limit]


def _num(v: float | None, fmt: str = "{:,.0f}") -> str:
    return "-" if v is None else fmt.format(v)


def render_frame(f: Mapping[str, Any]) -> str:
    """The frame for a terminal: a summary line, then a table of the bookies."""
    when = time.strftime("%H:%M:%S", time.gmtime(f["time_ms"] / 1000))
    b, t, ur = f["bookies"], f["totals"], f["under_replicated"]
    oldest = f", oldest {ur['oldest_seconds']:.0f}s" if ur["oldest_seconds"] is not None else ""
    lines = [
        f"pybk top {when}Z  bookies: {b['writable']} writable, {b['readonly']} read-only, "
        f"{b['unreachable']} unreachable  auditor: {f['auditor'] or 'none elected'}",
        f"adds/s {_num(t['adds_per_second'])}  in {_mib(t['add_bytes_per_second'])}  reads/s "
        f"{_num(t['reads_per_second'])}  errors/s {_num(t['errors_per_second'], '{:,.1f}')}  "
        f"under-replicated ledgers: {ur['ledgers']}{oldest}",
        "",
    ]
    headers = ["bookie", "state", "adds/s", "in", "reads/s", "err/s", "fsync p99", "write cache",
               "disk", "ledgers", "bad entries"]
    table = [[r["bookie"], r["state"], _num(r.get("adds_per_second")), _mib(r.get("add_bytes_per_second")),
              _num(r.get("reads_per_second")), _num(r.get("errors_per_second"), "{:,.1f}"),
              _ms(r.get("journal_fsync_p99_seconds")), human_bytes(r.get("write_cache_bytes")),
              _num(r.get("disk_usage_ratio"), "{:.0%}"), _num(r.get("ledgers")),
              _num(r.get("scrub_bad_entries"))] for r in f["rows"]]
    lines.append(format_table(headers, table, empty="no bookies registered"))
    if f.get("logs") is not None:
        lines += ["", format_table(["log", "records/s", "end offset"],
                                   [[r["log"], _num(r["records_per_second"]), _num(r["end_offset"])]
                                    for r in f["logs"]], empty="no logs")]
    return "\n".join(lines)


def _mib(v: float | None) -> str:
    return "-" if v is None else f"{v / (1 << 20):.1f} MiB/s"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.2f} ms"


async def _scrape(session, http: str, security) -> Sample | None:
    """One bookie's /metrics, or None when it does not answer (shown unreachable)."""
    import aiohttp

    from pybk.recovery.decommission import http_url
    from pybk.security.web import admin_headers, admin_ssl
    if not http:
        return None
    try:
        async with session.get(http_url(http, "/metrics"), ssl=admin_ssl(security),
                               headers=admin_headers(security)) as resp:
            if resp.status != 200:
                return None
            text = await resp.text()
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
        return None
    return parse_sample(text, time.monotonic())


LOG_SCAN_PARALLEL = 16   # logs whose end offsets are read at once


async def _log_ends(sh: Shell) -> dict[str, int | None]:
    """Every log's end offset now (None where it cannot be read: a MAC log without its password,
    or no bookie answering): one etcd read per log, and the open segment's LAC from its bookies."""
    from pybk.log import Logs
    logs = Logs(await sh.bk())
    gate = asyncio.Semaphore(LOG_SCAN_PARALLEL)

    async def one(name: str) -> tuple[str, int | None]:
        async with gate:
            try:
                return name, await logs.end_offset(name)
            except Exception:  # shown as unknown, not a failure of the view
                return name, None
    return dict(await asyncio.gather(*[one(n) async for n, _ in logs.meta.names()]))


async def _poll(sh: Shell, session, security, previous: Mapping[str, Sample | None]) -> tuple[dict, dict]:
    """Fetch one frame's inputs; returns (frame, samples by bookie)."""
    from pybk.recovery.admin import list_under_replicated, who_is_auditor
    store = await sh.store()
    writable, readonly = await asyncio.gather(store.registry.writable(), store.registry.readonly())
    infos = {**{b: (i, BookieState.WRITABLE) for b, i in writable.items()},
             **{b: (i, BookieState.READONLY) for b, i in readonly.items()}}
    scraped = await asyncio.gather(*(_scrape(session, i.http, security) for i, _ in infos.values()))
    samples = dict(zip(infos, scraped))
    markers, auditor = await asyncio.gather(list_under_replicated(store), who_is_auditor(store))
    f = frame(int(time.time() * 1000), {b: s for b, (_, s) in infos.items()}, samples, previous, markers,
              auditor.get("id") if auditor else None)
    return f, samples


def _top_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--interval", type=float, default=2.0, metavar="SECONDS",
                   help="seconds between frames (default 2); rates are over this interval")
    p.add_argument("--logs", type=int, default=5, metavar="N",
                   help="show the N busiest named logs by records/s between frames (default 5; 0: none). Each "
                        "frame reads every log's end offset: one etcd read and one bookie read per log")
    p.add_argument("--count", type=int, default=0, metavar="N",
                   help="stop after N frames (default: run until Ctrl-C); with -o json each frame is "
                        "one JSON object on its own line")


@command("top", "live view of the cluster: bookies by state, add/read rates, fsync p99, write cache, "
         "disk, under-replicated ledgers, the busiest named logs (refreshes every --interval; reads each "
         "bookie's /metrics, open by default, else with the shell's token, which then needs `reader`)",
         _top_args, stream=True)
async def top(sh: Shell, args: argparse.Namespace) -> None:
    import aiohttp

    from pybk.security.settings import ClientSecurity
    if args.interval <= 0:
        raise ShellError(f"--interval must be positive, not {args.interval}")
    if args.count < 0:
        raise ShellError(f"--count must be 0 (until Ctrl-C) or positive, not {args.count}")
    security = sh.security if sh.security is not None else ClientSecurity.from_env()
    clear = args.output == "text" and sys.stdout.isatty()
    previous: dict[str, Sample | None] = {}
    log_ends: dict[str, int | None] = {}
    log_at: float | None = None
    shown = 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT)) as session:
        while True:
            started = time.monotonic()
            f, samples = await _poll(sh, session, security, previous)
            previous = {b: s if s is not None else previous.get(b) for b, s in samples.items()}
            if args.logs > 0:
                ends, now = await _log_ends(sh), time.monotonic()
                f["logs"] = log_rows(ends, log_ends, now - log_at if log_at is not None else None, args.logs)
                log_ends, log_at = ends, now
            if args.output == "json":
                print(json.dumps(f), flush=True)
            else:
                print(("\x1b[H\x1b[2J" if clear else ("\n" if shown else "")) + render_frame(f), flush=True)
            shown += 1
            if args.count and shown >= args.count:
                return None
            await asyncio.sleep(max(0.0, args.interval - (time.monotonic() - started)))
