"""`pybk bench open-recovery`: how long opening a ledger with recovery takes when its writer died
with many entries past its LAC.

On a local cluster (etcd + `--bookies` bookie processes, fsync on) or an existing one
(`--metadata-uri`), stores `--entries` entries of a ledger on their write sets directly, each
carrying LAC -1 (as a writer that crashed before any LAC reached a bookie), then times
`open_ledger(recovery=True)`: fence, read forward and re-write every entry, close. Each run uses
a fresh ledger and a fresh client. `--batch` sets the client's `recovery_batch_size` (default: the
client's default). Prints seconds and entries/s per run, their median, and the exact command.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import statistics
import sys
import time

from .write import add_cluster_arguments, cluster
from pybk import eventloop

PASSWORD = b"bench-open-recovery"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_cluster_arguments(parser)
    parser.add_argument("--entries", type=int, default=10_000,
                        help="entries past the LAC the recovery re-writes (default 10000)")
    parser.add_argument("--runs", type=int, default=3, help="recoveries to time, one ledger each (default 3)")
    parser.add_argument("--batch", type=int, default=None,
                        help="the client's recovery_batch_size (default: the client's default)")


async def crashed_ledger(bk, args: argparse.Namespace) -> int:
    """A ledger whose writer stored every entry on its write set and died with LAC -1."""
    from pybk.entry import encode, master_key
    lh = await bk.create_ledger(args.ensemble, args.write_quorum, args.ack_quorum, password=PASSWORD)
    md = lh.metadata
    lid, mk = md.ledger_id, master_key(PASSWORD)
    clients = {b: await bk.client(b) for b in md.current_ensemble}
    data = os.urandom(args.size)
    window: list = []
    for eid in range(args.entries):
        body = encode(lid, eid, -1, data, md.digest_type, PASSWORD, (eid + 1) * args.size)
        window += [clients[b].add_nowait(lid, eid, body, mk) for b in md.write_set(eid)]
        if len(window) >= 4096:
            await asyncio.gather(*window)
            window = []
    await asyncio.gather(*window)
    return lid


async def bench(uri: str, args: argparse.Namespace) -> list[dict]:
    from pybk.client import BookKeeper, ClientOptions
    options = ClientOptions() if args.batch is None else ClientOptions(recovery_batch_size=args.batch)
    out = []
    for _ in range(args.runs):
        async with await BookKeeper.connect(uri) as bk:
            lid = await crashed_ledger(bk, args)
        async with await BookKeeper.connect(uri, options) as bk:
            t0 = time.perf_counter()
            rh = await bk.open_ledger(lid, password=PASSWORD)
            seconds = time.perf_counter() - t0
        if rh.metadata.last_entry_id != args.entries - 1:
            raise RuntimeError(f"recovery closed ledger {lid} at {rh.metadata.last_entry_id}, "
                               f"expected {args.entries - 1}")
        out.append({"ledger_id": lid, "seconds": round(seconds, 3),
                    "entries_per_s": round(args.entries / seconds, 1)})
    return out


def run(args: argparse.Namespace) -> int:
    command = "pybk " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    with cluster(args) as (uri, _pids):
        runs = eventloop.run(bench(uri, args))
    median = statistics.median(r["seconds"] for r in runs)
    result = {"command": command, "entries": args.entries, "size": args.size, "runs": runs,
              "median_seconds": median, "median_entries_per_s": round(args.entries / median, 1)}
    if args.output == "json":
        print(json.dumps(result))
        return 0
    for r in runs:
        print(f"recovered {args.entries} entries of {args.size} B past the LAC "
              f"(E{args.ensemble}/Qw{args.write_quorum}/Qa{args.ack_quorum}) in {r['seconds']:.2f}s: "
              f"{r['entries_per_s']:,.0f} entries/s")
    print(f"median of {len(runs)}: {median:.2f}s, {result['median_entries_per_s']:,.0f} entries/s")
    print(f"command: {command}")
    return 0
