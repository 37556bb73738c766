"""`pybk bench spark`: scan ledgers with Spark local[2] through the `pybk` data source.

Starts etcd and bookies on loopback (or uses --metadata-service-uri), writes --size bytes of
--entry-size entries into --ledgers ledgers with the client, then times a Spark scan that
touches every payload (sum of payload lengths). Prints MB/s and the exact command.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path


def _size(text: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = text.strip().lower().rstrip("ib").rstrip("b")
    if t and t[-1] in units:
        return int(float(t[:-1]) * units[t[-1]])
    return int(t)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--size", default="1GiB", help="bytes of payload to scan (default 1GiB; e.g. 64MiB)")
    parser.add_argument("--entry-size", type=int, default=1024, help="payload bytes per entry (default 1024)")
    parser.add_argument("--ledgers", type=int, default=4, help="ledgers to spread the data over (default 4)")
    parser.add_argument("--bookies", type=int, default=3, help="bookies to start (default 3)")
    parser.add_argument("--ensemble", type=int, default=3, help="E of the written ledgers (default 3)")
    parser.add_argument("--write-quorum", type=int, default=3,
                        help="Qw (default 3: every bookie holds every entry, so reads stream ranges)")
    parser.add_argument("--ack-quorum", type=int, default=2, help="Qa (default 2)")
    parser.add_argument("--entries-per-partition", type=int, default=None,
                        help="the source's entriesPerPartition (default: the source's default)")
    parser.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    parser.add_argument("--runs", type=int, default=2, help="timed scans (default 2; the best is reported)")
    parser.add_argument("--metadata-service-uri", default=None,
                        help="use this running cluster instead of starting one")
    parser.add_argument("--dir", default=None, help="data directory for the started cluster (default: temp)")
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text")


async def _write(uri: str, args: argparse.Namespace, total: int) -> tuple[list[int], float]:
    from pybk.client import BookKeeper
    entries = max(1, total // args.entry_size)
    per_ledger = [entries // args.ledgers + (1 if i < entries % args.ledgers else 0)
                  for i in range(args.ledgers)]
    payload = os.urandom(args.entry_size)
    bk = await BookKeeper.connect(uri)
    started = time.perf_counter()

    async def one(n: int) -> int:
        lh = await bk.create_ledger(ensemble=args.ensemble, write_quorum=args.write_quorum,
                                    ack_quorum=args.ack_quorum, password=b"")
        window: list = []
        for _ in range(n):
            window.append(lh.add_entry_async(payload))
            if len(window) >= 2048:
                await asyncio.gather(*window)
                window = []
        await asyncio.gather(*window)
        await lh.close()
        return lh.ledger_id

    try:
        ids = list(await asyncio.gather(*(one(n) for n in per_ledger if n > 0)))
    finally:
        await bk.close()
    return ids, time.perf_counter() - started


def _scan(spark, uri: str, ledgers: list[int], args: argparse.Namespace) -> tuple[int, int, float]:
    from pyspark.sql import functions as F
    r = (spark.read.format("pybk").option("metadataServiceUri", uri)
         .option("ledgers", ",".join(map(str, ledgers))))
    if args.entries_per_partition:
        r = r.option("entriesPerPartition", str(args.entries_per_partition))
    started = time.perf_counter()
    row = r.load().agg(F.count(F.lit(1)).alias("n"), F.sum(F.length("payload")).alias("b")).collect()[0]
    return int(row["n"]), int(row["b"] or 0), time.perf_counter() - started


def run(args: argparse.Namespace) -> int:
    from pybk.spark.session import JavaMissingError, local_session
    total = _size(args.size)
    command = "pybk bench spark " + " ".join(shlex.quote(a) for a in sys.argv[sys.argv.index("spark") + 1:]) \
        if "spark" in sys.argv else "pybk bench spark"
    procs: list = []
    tmp = None
    try:
        uri = args.metadata_service_uri
        if uri is None:
            from pybk.local.bookie import BookieProcess
            from pybk.local.etcd import EtcdProcess
            base = Path(args.dir) if args.dir else Path(tmp := tempfile.mkdtemp(prefix="pybk-bench-spark-"))
            etcd = EtcdProcess(base / "etcd")
            procs.append(etcd)
            etcd.start(timeout=60)
            uri = etcd.metadata_uri("pybk")
            started = [BookieProcess(base / f"bookie-{i}", metadata_uri=uri) for i in range(args.bookies)]
            for b in started:
                procs.append(b)
                b.start(wait=False)
            for b in started:
                b.wait_ready(b.is_ready, 120)
        ledgers, write_s = asyncio.run(_write(uri, args, total))
        written = (total // args.entry_size) * args.entry_size
        try:
            spark = local_session(args.master, "pybk-bench-spark")
        except JavaMissingError as exc:
            print(f"pybk bench spark: {exc}", file=sys.stderr)
            return 2
        scans = []
        for _ in range(max(1, args.runs)):
            n, nbytes, secs = _scan(spark, uri, ledgers, args)
            if nbytes != written:
                print(f"pybk bench spark: scan saw {nbytes} bytes, expected {written}", file=sys.stderr)
                return 1
            scans.append(secs)
        spark.stop()
        best = min(scans)
        result = {
            "command": command, "bytes": written, "entries": written // args.entry_size,
            "entry_size": args.entry_size, "ledgers": len(ledgers), "master": args.master,
            "write_seconds": round(write_s, 2), "write_MBps": round(written / write_s / 1e6, 1),
            "scan_seconds": [round(s, 2) for s in scans],
            "scan_MBps": round(written / best / 1e6, 1),
            "scan_entries_per_s": round(written / args.entry_size / best),
        }
        if args.output == "json":
            print(json.dumps(result))
        else:
            print(f"command:      {command}")
            print(f"data:         {written / (1 << 20):.0f} MiB in {result['entries']} entries of "
                  f"{args.entry_size} B over {len(ledgers)} ledgers (E{args.ensemble}/Qw{args.write_quorum}"
                  f"/Qa{args.ack_quorum}, {args.bookies} bookies)")
            print(f"write:        {write_s:.1f} s  ({result['write_MBps']} MB/s, client, not Spark)")
            print(f"scan ({args.master}): runs {', '.join(f'{s:.1f} s' for s in scans)}; best "
                  f"{result['scan_MBps']} MB/s, {result['scan_entries_per_s']} entries/s")
        return 0
    finally:
        for p in reversed(procs):
            p.stop()
        if tmp:
            import shutil
            shutil.rmtree(tmp, ignore_errors=True)
