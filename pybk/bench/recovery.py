"""`pybk bench recovery`: how fast a lost bookie's data comes back.

Starts etcd and four bookies in a temp dir, writes E3/Qw3/Qa2 ledgers until one chosen bookie
holds --size MiB of entries (only ledgers whose ensemble includes it are kept), starts one
`pybk autorecovery` process, kills the bookie with -9 and times until no ledger is under-
replicated nor references it. Prints the MB/s re-replicated (entry bytes copied / copy time) and
the whole time from the kill (which includes the registration lease TTL and the lost-bookie delay).
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
import urllib.request
from pathlib import Path
from pybk import eventloop


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--size", type=int, default=1024, help="MiB of entries the killed bookie holds (default 1024)")
    parser.add_argument("--entry-size", type=int, default=64 * 1024, help="payload bytes per entry (default 65536)")
    parser.add_argument("--ledger-size", type=int, default=64, help="MiB per ledger (default 64)")
    parser.add_argument("--lease-ttl", type=int, default=2, help="registration lease TTL in seconds (default 2)")
    parser.add_argument("--lost-bookie-delay", type=float, default=0.0,
                        help="autorecovery's lost-bookie delay in seconds (default 0)")
    parser.add_argument("--parallel-ledgers", type=int, default=4, help="autorecovery --parallel-ledgers (default 4)")
    parser.add_argument("--parallel-runs", type=int, default=4, help="autorecovery --parallel-runs (default 4)")
    parser.add_argument("--data-dir", help="where to put etcd and bookie data (default: a temp dir, removed after)")
    parser.add_argument("-o", "--output", choices=["human", "json"], default="human", help="output format")


def _metric(url: str, name: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return 0.0


async def _bench(args: argparse.Namespace, base: Path) -> dict:
    from pybk.client import BookKeeper
    from pybk.local.bookie import BookieProcess
    from pybk.local.etcd import EtcdProcess
    from pybk.meta import MetadataStore
    from pybk.local.autorecovery import AutoRecoveryProcess

    password = b"bench-recovery"
    etcd = EtcdProcess(base / "etcd").start()
    procs: list = []
    recovery = None
    try:
        uri = etcd.metadata_uri("pybk") + f"?lease_ttl={args.lease_ttl}"
        procs = [BookieProcess(base / f"bookie-{i}", metadata_uri=uri, registration_ttl=args.lease_ttl)
                 for i in range(4)]
        for p in procs:
            p.start(wait=False)
        for p in procs:
            p.wait_ready(p.is_ready, 60)
        victim = procs[0]
        store = await MetadataStore.connect(uri)
        bk = await BookKeeper.connect(uri)
        target = args.size << 20
        held = 0
        payload = os.urandom(args.entry_size)
        per_ledger = max(1, (args.ledger_size << 20) // args.entry_size)
        t_write = time.monotonic()
        try:
            while held < target:
                lh = await bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2, password=password)
                if victim.bookie_id not in lh.metadata.current_ensemble:
                    await lh.close()
                    await bk.delete_ledger(lh.ledger_id, password)
                    continue
                n = min(per_ledger, -(-(target - held) // args.entry_size))
                window = max(1, (16 << 20) // args.entry_size)
                for i in range(0, n, window):
                    await asyncio.gather(*(lh.add_entry_async(payload) for _ in range(min(window, n - i))))
                await lh.close()
                held += n * args.entry_size
            write_s = time.monotonic() - t_write
            recovery = AutoRecoveryProcess(base / "autorecovery.log", uri, lost_bookie_delay=args.lost_bookie_delay,
                                           poll_interval=0.2, audit_interval=0,
                                           parallel_ledgers=args.parallel_ledgers, parallel_runs=args.parallel_runs,
                                           ledger_password=password.decode()).start()
            t_kill = time.monotonic()
            victim.kill()
            t_marked = None
            while True:
                if not recovery.alive():  # it would never finish: say why instead of waiting forever
                    raise RuntimeError(f"the autorecovery process exited while re-replicating; log "
                                       f"{recovery.log_path}:\n{recovery.log_tail()}")
                marked = await store.underreplication.count()
                if marked and t_marked is None:
                    t_marked = time.monotonic()
                if t_marked is not None and not marked:
                    refs = [md.ledger_id async for md in store.ledgers.list_metadata() if victim.bookie_id in md.bookies()]
                    if not refs:
                        break
                await asyncio.sleep(0.05)
            t_done = time.monotonic()
            copied = _metric(recovery.http_url, "pybk_recovery_bytes_replicated_total")
        finally:
            await bk.close()
            await store.close()
        copy_s = t_done - t_marked
        return {"bytes_held_by_killed_bookie": held, "bytes_rereplicated": int(copied),
                "write_seconds": round(write_s, 2), "seconds_from_kill": round(t_done - t_kill, 2),
                "seconds_copying": round(copy_s, 2), "mb_per_s": round(copied / 1e6 / copy_s, 1),
                "mib_per_s": round(copied / (1 << 20) / copy_s, 1),
                "entry_size": args.entry_size, "lease_ttl_s": args.lease_ttl,
                "lost_bookie_delay_s": args.lost_bookie_delay}
    finally:
        if recovery is not None:
            recovery.kill()
        for p in procs:
            p.kill()
        etcd.stop()


def run(args: argparse.Namespace) -> int:
    command = "pybk bench recovery " + " ".join(shlex.quote(a) for a in sys.argv[sys.argv.index("recovery") + 1:])
    if args.data_dir:
        base = Path(args.data_dir)
        base.mkdir(parents=True, exist_ok=True)
        result = eventloop.run(_bench(args, base))
    else:
        with tempfile.TemporaryDirectory(prefix="pybk-bench-recovery-") as d:
            result = eventloop.run(_bench(args, Path(d)))
    result["command"] = command.strip()
    if args.output == "json":
        print(json.dumps(result, indent=2))
    else:
        print(f"re-replicated {result['bytes_rereplicated'] / (1 << 20):.0f} MiB of a killed bookie "
              f"({result['bytes_held_by_killed_bookie'] / (1 << 20):.0f} MiB held, {args.entry_size}-byte entries)")
        print(f"  copy phase: {result['seconds_copying']:.2f} s -> {result['mb_per_s']:.1f} MB/s "
              f"({result['mib_per_s']:.1f} MiB/s)")
        print(f"  from kill -9 to nothing under-replicated: {result['seconds_from_kill']:.2f} s "
              f"(lease TTL {args.lease_ttl} s + lost-bookie delay {args.lost_bookie_delay:g} s included)")
        print(f"  command: {result['command']}")
    return 0
