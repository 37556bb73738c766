"""`pybk bench bookie`: one bookie process, one client process, many 1 KiB adds in flight, fsync on.

Prints entries/s, MB/s, p50/p99 add latency (sampled: every 8th add), CPU per entry of client
and bookie, and the exact command.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path

from pybk import eventloop
from pybk import entry
from pybk.client.bookie_client import BookieClient
from pybk.local.bookie import BookieProcess

from .stats import cpu_seconds, percentile


SAMPLE_EVERY = 8  # latency is recorded for every 8th add (all adds are counted and checked)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--entries", type=int, default=300_000, help="entries to add (default 300000)")
    parser.add_argument("--size", type=int, default=1024, help="payload bytes per entry (default 1024)")
    parser.add_argument("--in-flight", type=int, default=20_000, help="adds outstanding at once (default 20000)")
    parser.add_argument("--ledgers", type=int, default=4, help="ledgers written round-robin (default 4)")
    parser.add_argument("--batch-bytes", type=int, default=1024 * 1024,
                        help="client batch size cap in bytes (default 1 MiB)")
    parser.add_argument("--no-fsync", action="store_true", help="run the bookie with journal_fsync=false")
    parser.add_argument("--dir", help="where the bookie keeps its dirs (default: a temp dir)")
    parser.add_argument("--bookie", metavar="HOST:PORT", help="use a running bookie instead of starting one")
    parser.add_argument("-o", "--output", choices=["human", "json"], default="human")


def run(args: argparse.Namespace) -> int:
    command = "pybk " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    if args.bookie:
        result = eventloop.run(_bench(args.bookie, args))
    else:
        with tempfile.TemporaryDirectory(prefix="pybk-bench-", dir=args.dir) as d:
            proc = BookieProcess(Path(d), checkpoint_interval=10, journal_fsync=not args.no_fsync)
            proc.start()
            try:
                cpu0 = cpu_seconds([proc.pid])
                result = eventloop.run(_bench(proc.address, args))
                result["bookie_cpu_us_per_entry"] = (cpu_seconds([proc.pid]) - cpu0) / args.entries * 1e6
            finally:
                proc.stop()
    result["command"] = command
    if args.output == "json":
        print(json.dumps(result))
    else:
        print(f"{result['entries']} entries of {args.size} B, {args.in_flight} in flight, fsync "
              f"{'off' if args.no_fsync else 'on'}: {result['entries_per_s']:,.0f} entries/s, "
              f"{result['mb_per_s']:.1f} MB/s, add latency p50 {result['p50_ms']:.1f} ms, "
              f"p99 {result['p99_ms']:.1f} ms\nCPU per entry: client {result['client_cpu_us_per_entry']:.1f} us"
              + (f", bookie {result['bookie_cpu_us_per_entry']:.1f} us" if "bookie_cpu_us_per_entry" in result else "")
              + f"\ncommand: {command}")
    if result["errors"]:
        print(f"{result['errors']} adds failed", file=sys.stderr)
        return 1
    return 0


async def _bench(address: str, args: argparse.Namespace) -> dict:
    key = entry.master_key(b"bench")
    payload = b"x" * args.size
    base = int(time.time() * 1000) % (1 << 40) * 1000
    ledgers = [base + i for i in range(args.ledgers)]
    n = args.entries
    bodies = [entry.encode(ledgers[i % len(ledgers)], i // len(ledgers), -1, payload) for i in range(n)]
    client = await BookieClient.connect(address, wait=30, max_batch_bytes=args.batch_bytes)
    # warm up the stream
    await client.add(ledgers[0] + 10_000_000, 0, entry.encode(ledgers[0] + 10_000_000, 0, -1, b"w"), master_key=key)
    latencies: list[float] = []
    state = {"next": 0, "done": 0, "errors": 0}
    finished = asyncio.get_running_loop().create_future()
    perf = time.perf_counter
    nl = len(ledgers)
    sample = SAMPLE_EVERY

    def send() -> None:
        i = state["next"]
        state["next"] = i + 1
        if i % sample:
            client.add_callback(ledgers[i % nl], i // nl, bodies[i], key, False, done)
        else:  # every SAMPLE_EVERY-th add also records its latency
            t = perf()
            client.add_callback(ledgers[i % nl], i // nl, bodies[i], key, False,
                                lambda err: (latencies.append(perf() - t), done(err)))

    def done(err) -> None:
        if err is not None:
            state["errors"] += 1
        state["done"] += 1
        if state["next"] < n:
            send()
        elif state["done"] == n and not finished.done():
            finished.set_result(None)

    t0 = perf()
    cpu0 = time.process_time()
    for _ in range(min(args.in_flight, n)):
        send()
    await finished
    elapsed = perf() - t0
    cpu = time.process_time() - cpu0
    await client.close()
    latencies.sort()
    m = len(latencies)
    return {"entries": n, "errors": state["errors"], "seconds": elapsed, "entries_per_s": n / elapsed,
            "mb_per_s": n * args.size / elapsed / 1e6, "p50_ms": percentile(latencies, 0.5) * 1000,
            "p99_ms": percentile(latencies, 0.99) * 1000, "latency_samples": m,
            "client_cpu_us_per_entry": cpu / n * 1e6, "in_flight": args.in_flight, "size": args.size}
