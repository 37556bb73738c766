"""`pybk bench read`: ledger reads through the client on a local cluster (or `--metadata-uri`).

Writes one ledger (E3/Qw3/Qa2, 1 KiB entries by default), closes it, then measures a full
sequential scan (`read_entries(0, last)`: entries/s, MB/s, per-entry gaps p50/p99/p999) and
single-entry reads one at a time (window 1: latency p50/p99/p999). Prints the exact command.
"""
from __future__ import annotations

import argparse
import random
import shlex
import sys
import time

from .write import add_cluster_arguments, cluster, print_results, summary, write_ledger
from pybk import eventloop


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_cluster_arguments(parser)
    parser.add_argument("--entries", type=int, default=100_000, help="entries to write, then scan (default 100000)")
    parser.add_argument("--single-reads", type=int, default=2000,
                        help="random single-entry reads, one at a time (default 2000)")
    parser.add_argument("--scans", type=int, default=2, help="full scans to time (default 2; the best is shown)")


async def bench_reads(uri: str, args: argparse.Namespace) -> list[dict]:
    from pybk.client import BookKeeper
    out = []
    async with await BookKeeper.connect(uri) as bk:
        lh = await bk.create_ledger(args.ensemble, args.write_quorum, args.ack_quorum, password=b"bench")
        await write_ledger(lh, args.entries, args.size, 256)
        await lh.close()
        rh = await bk.open_ledger(lh.ledger_id, password=b"bench")
        last = rh.last_add_confirmed
        best = None
        for _ in range(max(1, args.scans)):
            gaps = []
            perf = time.perf_counter
            t0 = prev = perf()
            cpu0 = time.process_time()
            count = 0
            async for _e in rh.read_entries(0, last):
                now = perf()
                gaps.append(now - prev)
                prev = now
                count += 1
            seconds = perf() - t0
            cpu = time.process_time() - cpu0
            if count != last + 1:
                raise RuntimeError(f"scan returned {count} entries, expected {last + 1}")
            if best is None or seconds < best[0]:
                best = (seconds, gaps, cpu)
        seconds, gaps, cpu = best
        out.append(summary(f"pybk scan E{args.ensemble}/Qw{args.write_quorum}/Qa{args.ack_quorum} (gaps between entries)",
                           last + 1, args.size, seconds, gaps, ledger_id=lh.ledger_id,
                           client_cpu_us_per_entry=round(cpu / (last + 1) * 1e6, 1)))
        rng = random.Random(1)
        lat = []
        t0 = time.perf_counter()
        for _ in range(args.single_reads):
            eid = rng.randrange(last + 1)
            t = time.perf_counter()
            await rh.read_entry(eid)
            lat.append(time.perf_counter() - t)
        out.append(summary("pybk single-entry reads window=1", args.single_reads, args.size,
                           time.perf_counter() - t0, lat))
    return out


def run(args: argparse.Namespace) -> int:
    command = "pybk " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    with cluster(args) as (uri, _pids):
        results = eventloop.run(bench_reads(uri, args))
    print_results(results, command, args.output)
    return 0
