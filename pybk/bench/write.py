"""`pybk bench write`: ledger writes through the client, E3/Qw3/Qa2, 1 KiB entries, on a local
cluster (etcd + 3 bookie processes, fsync on) or an existing one (`--metadata-uri`).

Measures entries/s, MB/s, add latency p50/p99/p999 and CPU per entry at each window (adds in
flight; default 256 and 1). With `--peer-nats` each round is a pair: pybk at each window, then NATS
JetStream R3 with fsync always (`pybk.bench.peer_nats`, the `bench` extra) at the same windows with
the same entry size and counts, and the ratios pybk / JetStream. `--repeat N` runs N rounds back to
back (a fresh local cluster each) and prints each round, the medians over rounds and the ratios'
medians. With `--tls` a second local cluster runs beside the first, its bookies serving TLS and
checking a bearer token (certificates from a throwaway CA); each window is measured on both in turn
and the ratios TLS / plain are printed. Prints the exact command.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from .stats import by_run, cpu_seconds, summary, warmup
from pybk import eventloop

if TYPE_CHECKING:
    from pybk.security.settings import ClientSecurity

# The figures that vary between rounds: their medians are reported; other fields are kept when
# every round agrees on them.
MEASURED = ("seconds", "entries_per_s", "mb_per_s", "p50_ms", "p99_ms", "p999_ms", "client_cpu_us_per_entry",
            "bookies_cpu_us_per_entry", "servers_cpu_us_per_entry", "throughput_ratio", "p50_ratio")
RATIOS = ("throughput_ratio", "p50_ratio")

EPILOG = """\
rounds and pairs:
  Each round measures pybk at every window (a new ledger per window, after a warm-up) on a
  local cluster started for the round (or the --metadata-uri one). With --peer-nats the
  round is a pair: then NATS JetStream at the same windows with the same --size, --entries
  and --window1-entries and the same warm-up (3 nats-servers on loopback, R3 file stream,
  sync_interval always; one nats-py client publishing with publish_async, at most WINDOW
  pending, or at window 1 one await js.publish at a time), and per window the ratios
  pybk / JetStream of entries/s (above 1: pybk is faster) and of p50 latency (below 1:
  pybk is faster). --peer-nats needs the bench extra: pip install 'pybk[bench]'.

  With --repeat N (or --peer-nats) it prints each round, the medians over the rounds of
  every figure and of the ratios (with each round's ratio), and the exact command. -o json
  prints one object: {"command", "repeat", "pairs": [{"pair", "results"}], "medians",
  "ratios"}; a single round without --peer-nats prints {"command", "results"}.

  The published figures (docs/performance.md): pybk bench write --peer-nats --repeat 5
"""


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
                        help="after pybk, run NATS JetStream R3 with fsync always at the same windows and counts, "
                             "and print the ratios pybk / JetStream (needs pip install 'pybk[bench]')")
    parser.add_argument("--repeat", type=int, default=1, metavar="N",
                        help="rounds (pairs with --peer-nats) run back to back; prints each and the medians "
                             "(default 1; 5 for the published figures)")
    parser.add_argument("--tls", action="store_true",
                        help="also run on local bookies serving TLS with token authentication, and print the "
                             "throughput and window-1 p50 latency ratios TLS / plain")
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter


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


def entries_at(args: argparse.Namespace, window: int) -> int:
    """Entries measured at this window: --window1-entries at window 1, else --entries."""
    return args.window1_entries if window == 1 else args.entries


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
            n = entries_at(args, window)
            lh = await bk.create_ledger(args.ensemble, args.write_quorum, args.ack_quorum, password=b"bench")
            warm, warm_window = warmup(n, window)
            await write_ledger(lh, warm, args.size, warm_window)   # warm up streams and caches
            cpu0, bcpu0 = time.process_time(), cpu_seconds(pids)
            seconds, lat = await write_ledger(lh, n, args.size, window)
            cpu, bcpu = time.process_time() - cpu0, cpu_seconds(pids) - bcpu0
            await lh.close()
            out.append(summary(f"pybk E{args.ensemble}/Qw{args.write_quorum}/Qa{args.ack_quorum} window={window}"
                               f"{label}", n, args.size, seconds, lat, window=window, ledger_id=lh.ledger_id,
                               client_cpu_us_per_entry=round(cpu / n * 1e6, 1),
                               **({"bookies_cpu_us_per_entry": round(bcpu / n * 1e6, 1)} if pids else {})))
    return out


def peer_ratios(pybk: list[dict], peer: list[dict]) -> list[dict]:
    """Per window, pybk / JetStream: entries/s (above 1: pybk is faster) and p50 latency (below 1:
    pybk is faster)."""
    from .peer_nats import NAME
    by_window = {r["window"]: r for r in peer}
    out = []
    for p in pybk:
        j = by_window.get(p["window"])
        if j is None:
            continue
        out.append({"run": f"pybk / JetStream window={p['window']}", "window": p["window"], "peer": NAME,
                    "throughput_ratio": round(p["entries_per_s"] / j["entries_per_s"], 3),
                    "p50_ratio": round(p["p50_ms"] / j["p50_ms"], 3) if j["p50_ms"] else None})
    return out


def medians(rounds: list[list[dict]]) -> list[dict]:
    """One row per run name over the rounds, in first-seen order: the median of each MEASURED
    figure, each round's value of a ratio (`throughput_ratios`, `p50_ratios`), and the other
    fields where every round agrees."""
    out = []
    for name, rows in by_run(rounds).items():
        row: dict = {"run": name, "pairs": len(rows)}
        for key in rows[0]:
            values = [r.get(key) for r in rows]
            if key in MEASURED:
                present = [v for v in values if v is not None]
                row[key] = round(statistics.median(present), 3) if present else None
                if key in RATIOS:
                    row[key + "s"] = values
            elif key != "run" and all(v == values[0] for v in values):
                row[key] = values[0]
        out.append(row)
    return out


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


def format_result(r: dict) -> str:
    """One result row as a line: a run's figures, or a ratio row."""
    if "peer" in r:
        return (f"{r['run']}: entries/s {_ratio(r, 'throughput_ratio')}, p50 latency {_ratio(r, 'p50_ratio')}")
    if "throughput_ratio" in r:
        return (f"{r['run']}: throughput {r['throughput_ratio']:.2f}x, p50 latency {r['p50_ratio']:.2f}x "
                f"({(1 - r['throughput_ratio']) * 100:.1f}% fewer entries/s)")
    return (f"{r['run']}: {r['entries']} entries of {r['size']} B in {r['seconds']:.2f}s: "
            f"{r['entries_per_s']:,.0f} entries/s, {r['mb_per_s']:.1f} MB/s, latency p50 {r['p50_ms']:.2f} ms, "
            f"p99 {r['p99_ms']:.2f} ms, p999 {r['p999_ms']:.2f} ms"
            + (f"; CPU per entry: client {r['client_cpu_us_per_entry']} us" if "client_cpu_us_per_entry" in r else "")
            + (f", bookies {r['bookies_cpu_us_per_entry']} us" if "bookies_cpu_us_per_entry" in r else "")
            + (f", servers {r['servers_cpu_us_per_entry']} us" if "servers_cpu_us_per_entry" in r else ""))


def _ratio(r: dict, key: str) -> str:
    """A ratio as `1.23x`, followed by each round's value when r is a median row."""
    value = "n/a" if r.get(key) is None else f"{r[key]:.2f}x"
    rounds = r.get(key + "s")
    if rounds:
        value += " (pairs: " + ", ".join("n/a" if v is None else f"{v:.2f}" for v in rounds) + ")"
    return value


def print_results(results: list[dict], command: str, output: str) -> None:
    if output == "json":
        print(json.dumps({"command": command, "results": results}))
        return
    for r in results:
        print(format_result(r))
    print(f"command: {command}")


def print_rounds(rounds: list[list[dict]], command: str, output: str) -> None:
    """Each round (pair), the medians over them and the ratios' medians, and the command."""
    middle = medians(rounds)
    ratios = [r for r in middle if "throughput_ratio" in r]
    if output == "json":
        print(json.dumps({"command": command, "repeat": len(rounds),
                          "pairs": [{"pair": i, "results": results} for i, results in enumerate(rounds, 1)],
                          "medians": middle, "ratios": ratios}))
        return
    for i, results in enumerate(rounds, 1):
        print(f"pair {i} of {len(rounds)}:")
        for r in results:
            print("  " + format_result(r))
    print(f"medians of {len(rounds)} pairs:")
    for r in middle:
        if "throughput_ratio" not in r:
            print("  " + format_result(r))
    print("ratios, medians of the pairs:")
    for r in ratios:
        print("  " + format_result(r))
    print(f"command: {command}")


def one_round(args: argparse.Namespace, windows: list[int]) -> list[dict]:
    """pybk at each window on a cluster of its own (plain, and TLS beside it with --tls), then with
    --peer-nats JetStream at the same windows and counts, and the ratios."""
    if args.tls:
        with cluster(args) as (uri, pids), tls_cluster(args) as (tls_uri, tls_pids, security):
            plain, secured = eventloop.run(interleaved(args, windows, (uri, pids), (tls_uri, tls_pids, security)))
        results = plain + secured + tls_ratios(plain, secured)
    else:
        with cluster(args) as (uri, pids):
            plain = results = eventloop.run(bench_writes(uri, pids, args, windows))
    if args.peer_nats:
        from .peer_nats import run_jetstream
        peer = run_jetstream([(w, entries_at(args, w)) for w in windows], args.size, args.dir)
        results = results + peer + peer_ratios(plain, peer)
    return results


def run(args: argparse.Namespace) -> int:
    command = "pybk " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    windows = [int(w) for w in str(args.windows).split(",") if w.strip()]
    if args.tls and args.metadata_uri:
        print("pybk bench write: --tls starts its own local clusters; leave out --metadata-uri", file=sys.stderr)
        return 2
    from .peer_nats import refuse_rounds
    refused = refuse_rounds("pybk bench write", args.repeat, args.peer_nats)
    if refused is not None:
        return refused
    rounds = [one_round(args, windows) for _ in range(args.repeat)]
    if len(rounds) == 1 and not args.peer_nats:
        print_results(rounds[0], command, args.output)
    else:
        print_rounds(rounds, command, args.output)
    return 0
