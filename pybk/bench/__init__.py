"""`pybk bench NAME`: benchmarks, one module per target (pybk/bench/NAME.py, a dash in NAME
becoming an underscore).

Each module exposes `add_arguments(parser)` and `run(args) -> int` and prints its figures
together with the exact command that produced them. Benchmarks are never timed tests.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from pybk import eventloop
from pybk.eventloop import parse_event_loop

BENCHMARKS: dict[str, str] = {
    "bookie": "one bookie, many adds in flight from one client: entries/s, MB/s, latency",
    "meta": "ledger metadata create+close cycles and list throughput against etcd",
    "write": "ledger writes E3/Qw3/Qa2 on a local cluster, window 256 and window 1",
    "read": "ledger reads on a local cluster",
    "recovery": "time to re-replicate a lost bookie's data",
    "spark": "scan ledgers with Spark local[2]",
    "floor": "latency floor of a window-1 replicated add: bare gRPC servers that fdatasync, no pybk",
    "open-recovery": "open with recovery of a ledger whose writer died with many entries past its LAC",
    "log": "named logs: records/s (100 B, append_many, 1 KiB), end-to-end latency, writer takeover, etcd cost",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK", required=True)
    argv = sys.argv[1:]
    chosen = next((a for a in argv if a in BENCHMARKS), None)
    for name, help_text in BENCHMARKS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            mod = importlib.import_module(f"pybk.bench.{name.replace('-', '_')}")
            mod.add_arguments(p)
            if name != "floor":  # floor chooses each side's loop itself (--loop, --server-loop)
                p.add_argument("--event-loop", type=parse_event_loop, metavar="LOOP",
                               help="event loop of the benchmark's client and the processes it starts: auto "
                                    "(uvloop when installed, else asyncio), asyncio or uvloop (default: "
                                    f"${eventloop.ENV}, else auto)")
            p.set_defaults(_bench=mod.run)


def run(args: argparse.Namespace) -> int:
    if not hasattr(args, "_bench"):
        print(f"pybk bench {args.benchmark}: not available yet", file=sys.stderr)
        return 2
    from pybk.local.client import security_for
    from pybk.local.etcd import EtcdMissing
    if getattr(args, "metadata_uri", None):
        # a cluster given by URI: the local cluster's credentials when it is that one (started
        # --secure), for every client the benchmark opens (they default to the environment's)
        os.environ.update(security_for(args.metadata_uri).as_env())
    if getattr(args, "event_loop", None):
        os.environ[eventloop.ENV] = args.event_loop  # the bookies and autorecovery it starts inherit it
    try:
        eventloop.resolve(None)
        return int(args._bench(args) or 0)
    except eventloop.EventLoopError as e:
        print(f"pybk bench {args.benchmark}: error: {e}", file=sys.stderr)
        return 1
    except EtcdMissing as e:
        print(f"pybk bench {args.benchmark}: error: {e}", file=sys.stderr)
        return 1
