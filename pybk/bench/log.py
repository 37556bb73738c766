"""`pybk bench log`: named logs (pybk.log) on a local cluster (etcd + 3 bookie processes, fsync on,
E3/Qw3/Qa2) or an existing one (`--metadata-uri`), against the goals of docs/logs.md.

Each round measures, on one cluster:
- `100 B pipelined`: one writer, `append_nowait` of 100-byte records (records/s, ack latency of
  every 64th record);
- `100 B append_many`: the same records by `append_many` (lists of 10,000, 8 calls in flight);
- `1 KiB pipelined` and, on the same cluster, the ledger write path at window 256 with 1 KiB
  entries (`pybk bench write`'s run): the ratio log records/s / ledger entries/s;
- `end-to-end`: a tailing reader's (in a process of its own) delay from `append` to the
  record's arrival at --rate records/s, beside the ledger path's window-1 add latency with
  records of the same size (the goal is the default writer's); then, for comparison, with each
  record sent at once (WriterOptions(linger=0)) and the LAC told 1 ms after adds go idle
  (ClientOptions(explicit_lac_delay=0.001)): more entries and adds, so on two cores it is slower
  than the default, whose next entry goes out with the acknowledgement and carries its LAC;
- `takeover`: a writer process appending under load is killed with -9; a new writer opens and
  appends: time from `open_writer` being called to its first acknowledged append (--takeovers times);
- `etcd bytes per idle log`: the keys and values of a log with a name, config, head, one closed
  segment and one cursor;
- `open of N segments`: a log whose head and N closed segments are written straight into etcd,
  then `open_writer` (it reads only the last segment) and finding the segment of a middle offset
  (a binary search over the segment keys).
With `--peer-nats` JetStream R3 (`sync_interval: always`, `publish_async` with at most
--peer-window pending) publishes the same number of 100-byte messages in the same round, and the
ratio pybk / JetStream of records/s is printed. `--repeat N` runs N rounds (fresh clusters) and
prints each, the medians and the goals met or missed. `--only` runs some of the measurements
(the goals of those alone are checked). Prints the exact command.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from pybk import eventloop

from .stats import by_run, cpu_seconds, summary

if TYPE_CHECKING:
    from pybk.log import LogWriter, Logs

PASSWORD = b"bench-log"
RECORD = 100
KIB = 1024
# what --only may choose: each a measurement of a round (with the ledger run it is compared with)
PARTS = ("pipelined", "append-many", "kib", "end-to-end", "takeover", "etcd", "segments")

EPILOG = """\
goals (docs/logs.md; checked on the medians):
  100 B pipelined records/s >= 10x JetStream's (with --peer-nats); append_many >= 1,000,000 records/s;
  1 KiB records/s >= the ledger path's entries/s at window 256; end-to-end p50 within 2 ms of the
  window-1 add p50, p99 <= 10 ms; takeover p50 <= 100 ms; etcd bytes per idle log <= 1 KiB;
  opening a log of 100,000 segments <= 1 s.

  The published figures (docs/performance.md): pybk bench log --peer-nats --repeat 5
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--metadata-uri", metavar="URI",
                        help="use this running cluster instead of starting etcd and bookies locally")
    parser.add_argument("--bookies", type=int, default=3, help="bookies to start locally (default 3)")
    parser.add_argument("--dir", help="parent dir of the local cluster's data (default: a temp dir)")
    parser.add_argument("--bookie-option", action="append", default=[], metavar="NAME=VALUE",
                        help="extra `pybk bookie` option for the local bookies (repeatable)")
    parser.add_argument("--records", type=int, default=200_000,
                        help="100-byte records of the pipelined run, and JetStream messages (default 200000)")
    parser.add_argument("--many-records", type=int, default=2_000_000,
                        help="100-byte records of the append_many run (default 2000000)")
    parser.add_argument("--kib-records", type=int, default=100_000,
                        help="1 KiB records, and ledger entries at window 256 (default 100000)")
    parser.add_argument("--rate", type=int, default=1000, help="records/s of the end-to-end run (default 1000)")
    parser.add_argument("--latency-records", type=int, default=5000,
                        help="records of the end-to-end run, and window-1 ledger adds (default 5000)")
    parser.add_argument("--takeovers", type=int, default=5, help="forced writer takeovers measured (default 5)")
    parser.add_argument("--segments", type=int, default=100_000,
                        help="segments of the log whose open is timed (default 100000)")
    parser.add_argument("--peer-nats", action="store_true",
                        help="JetStream R3 sync=always publishes --records 100-byte messages in each round "
                             "(needs pip install 'pybk[bench]')")
    parser.add_argument("--peer-window", type=int, default=1024,
                        help="JetStream publish_async max pending (default 1024)")
    parser.add_argument("--repeat", type=int, default=1, metavar="N", help="rounds (default 1; 5 published)")
    parser.add_argument("--only", action="append", choices=PARTS, metavar="PART",
                        help="run only this measurement (repeatable): " + ", ".join(PARTS) +
                             "; kib includes the ledger path at window 256, end-to-end the window-1 adds "
                             "(default: all)")
    parser.add_argument("-o", "--output", choices=["human", "json"], default="human",
                        help="human-readable lines (default) or one JSON object")
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter


# ---- the measured runs --------------------------------------------------------------------------

async def pipelined(w: "LogWriter", n: int, size: int, chunk: int = 8192) -> tuple[float, list[float]]:
    """n records by append_nowait, at most two chunks unacknowledged; (seconds, latencies of every
    64th record)."""
    payload = os.urandom(size)
    perf = time.perf_counter
    lat: list[float] = []
    prev = None
    t0 = perf()
    for start in range(0, n, chunk):
        last = None
        for i in range(start, min(n, start + chunk)):
            last = w.append_nowait(payload)
            if not i & 63:
                last.add_done_callback(lambda p, t=perf(): lat.append(perf() - t))
        if prev is not None:
            await prev
        prev = last
    await prev
    return perf() - t0, lat


async def many(w: "LogWriter", n: int, size: int, chunk: int = 10_000, inflight: int = 8) -> tuple[float, list[float]]:
    """n records by append_many in lists of `chunk`, `inflight` calls at once; (seconds, each
    call's latency)."""
    payloads = [os.urandom(size)] * chunk
    perf = time.perf_counter
    lat: list[float] = []

    async def call(k: int) -> None:
        t = perf()
        await w.append_many(payloads if k == chunk else payloads[:k])
        lat.append(perf() - t)
    tasks: list[asyncio.Future] = []
    t0 = perf()
    for start in range(0, n, chunk):
        tasks.append(asyncio.ensure_future(call(min(chunk, n - start))))
        if len(tasks) >= inflight:
            await tasks.pop(0)
    await asyncio.gather(*tasks)
    return perf() - t0, lat


READER_CHILD = """
import asyncio, json, sys, time
from pybk import eventloop
from pybk.client import BookKeeper
from pybk.log import Logs
async def main(uri, name, n):
    async with await BookKeeper.connect(uri) as bk:
        r = await Logs(bk).open_reader(name, start="latest")
        print(json.dumps({"start": r.position}), flush=True)
        arrivals = []
        cpu = None
        async for rec in r:
            if cpu is None:
                cpu = time.process_time()
            arrivals.append((rec.offset, time.perf_counter()))
            if len(arrivals) == n:
                break
        cpu = time.process_time() - cpu
        await r.close()
    print(json.dumps({"arrivals": arrivals, "cpu": cpu}), flush=True)
eventloop.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""


async def end_to_end(logs: "Logs", uri: str, name: str, n: int, rate: int,
                     linger: float | None = None) -> tuple[float, list[float], float]:
    """n records at `rate`/s; each one's delay from append_nowait in this process to a tailing
    reader in another (a consumer is rarely its producer's process; both read the same monotonic
    clock, CLOCK_MONOTONIC); (seconds, delays, the reader's CPU seconds from its first record on)."""
    from pybk.log import WriterOptions
    perf = time.perf_counter
    reader = subprocess.Popen([sys.executable, "-c", READER_CHILD, uri, name, str(n)], stdout=subprocess.PIPE)
    try:
        start = json.loads(await asyncio.wait_for(asyncio.to_thread(reader.stdout.readline), 60))["start"]
        options = WriterOptions() if linger is None else WriterOptions(linger=linger)   # None: the defaults
        w = await logs.open_writer(name, password=PASSWORD, options=options)
        if w.next_offset != start:
            raise RuntimeError(f"the reader starts at {start}, the writer at {w.next_offset}")
        sent = [0.0] * n
        pad = os.urandom(RECORD)
        await asyncio.sleep(0.2)   # the reader is waiting at the head
        t0 = perf()
        for i in range(n):
            delay = t0 + i / rate - perf()
            if delay > 0:
                await asyncio.sleep(delay)
            sent[i] = perf()
            w.append_nowait(pad)
        await w.flush()
        line = await asyncio.wait_for(asyncio.to_thread(reader.stdout.readline), 60 + n / rate)
        seconds = perf() - t0
        await w.close()
    finally:
        reader.kill()
        reader.wait()
    got = json.loads(line)
    return seconds, [at - sent[offset - start] for offset, at in got["arrivals"]], got["cpu"]


async def end_to_end_runs(uri: str, logs: "Logs", named: Callable[[str], str], args: argparse.Namespace) -> list[dict]:
    """The end-to-end rows: the default configuration (the goal's), then linger 0 with an explicit
    LAC, for comparison."""
    from pybk.client import BookKeeper
    from pybk.client.bookkeeper import ClientOptions
    from pybk.log import Logs
    await logs.create(named("e2e"), password=PASSWORD)
    n = args.latency_records
    seconds, lat, cpu = await end_to_end(logs, uri, named("e2e"), n, args.rate)
    out = [summary(f"log end-to-end append -> tailing reader at {args.rate}/s", n, RECORD, seconds, lat,
                   reader_cpu_us_per_record=round(cpu / n * 1e6, 1))]
    # for comparison: entries sent at the next turn of the loop, the LAC told 1 ms after adds go idle
    async with await BookKeeper.connect(uri, options=ClientOptions(explicit_lac_delay=0.001)) as tuned:
        tlogs = Logs(tuned)
        await tlogs.create(named("e2e-tuned"), password=PASSWORD)
        seconds, lat, cpu = await end_to_end(tlogs, uri, named("e2e-tuned"), n, args.rate, linger=0)
    out.append(summary(f"log end-to-end at {args.rate}/s, linger 0, explicit LAC 1 ms", n, RECORD, seconds, lat,
                       reader_cpu_us_per_record=round(cpu / n * 1e6, 1)))
    return out


TAKEOVER_CHILD = """
import asyncio, sys
from pybk.client import BookKeeper
from pybk.log import Logs
async def main(uri, name, pw):
    bk = await BookKeeper.connect(uri)
    w = await Logs(bk).open_writer(name, password=pw.encode())
    payloads = [b"x" * 100] * 1000
    print("OPEN", flush=True)
    while True:
        await w.append_many(payloads)
asyncio.run(main(*sys.argv[1:4]))
"""


async def takeovers(logs: "Logs", uri: str, name: str, times: int) -> list[float]:
    """Seconds from open_writer to the first acknowledged append after a writer under load is
    killed with -9, `times` times."""
    out = []
    for _ in range(times):
        child = subprocess.Popen([sys.executable, "-c", TAKEOVER_CHILD, uri, name, PASSWORD.decode()],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        try:
            line = await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), 60)
            if line.strip() != b"OPEN":
                raise RuntimeError("the takeover child did not open its writer")
            await asyncio.sleep(0.5)   # under load
        finally:
            child.kill()
            child.wait()
        t0 = time.perf_counter()
        w = await logs.open_writer(name, password=PASSWORD)
        await w.append(b"first")
        out.append(time.perf_counter() - t0)
        await w.close()
    return out


async def idle_log_bytes(logs: "Logs", name: str) -> int:
    """etcd key and value bytes of an idle log: name, config, head, one closed segment, one cursor."""
    from pybk.meta.etcd import prefix_end
    ref = await logs.create(name, password=PASSWORD)
    async with await logs.open_writer(name, password=PASSWORD) as w:
        await w.append(b"x" * RECORD)
    await logs.commit(name, "consumer", 1)
    k = logs.meta.keys
    resp = await logs.meta.etcd.range(k.log(ref.log_id), prefix_end(k.log(ref.log_id)))
    name_kv = await logs.meta.etcd.get(k.name(name))
    return sum(len(kv.key) + len(kv.value) for kv in resp.kvs) + len(name_kv.key) + len(name_kv.value)


async def open_many_segments(logs: "Logs", name: str, count: int) -> tuple[float, float, float]:
    """(seconds to write them, seconds of open_writer, seconds to find a middle offset's segment) for
    a log of `count` closed segments of 100 records written straight into etcd."""
    from pybk.log.layout import Head, Segment, SegmentState
    from pybk.log.reader import find_segment
    from pybk.meta.etcd import op_put
    ref = await logs.create(name, password=PASSWORD)
    k = logs.meta.keys
    now = int(time.time() * 1000)
    t0 = time.perf_counter()
    for start in range(0, count, 127):
        ops = [op_put(k.segment(ref.log_id, s), Segment(s, 1 << 40 | s, SegmentState.CLOSED, 1, s * 100, 100, 11_600,
                                                        now, now, 0, now).to_bytes())
               for s in range(start, min(count, start + 127))]
        await logs.meta.etcd.txn([], ops, what="bench segments")
    await logs.meta.etcd.put(k.head(ref.log_id), Head(1, "bench", last_seq=count - 1).to_bytes())
    written = time.perf_counter() - t0
    t0 = time.perf_counter()
    w = await logs.open_writer(name, password=PASSWORD)
    opened = time.perf_counter() - t0
    t0 = time.perf_counter()
    seg = await find_segment(logs, ref, count * 50 + 7)
    found = time.perf_counter() - t0
    assert seg is not None and seg.seq == count // 2, seg
    await w.close()
    return written, opened, found


def _row(name: str, n: int, size: int, seconds: float, lat: list[float], cpu: float, bcpu: float | None,
         **extra: Any) -> dict:
    return summary(name, n, size, seconds, lat, client_cpu_us_per_entry=round(cpu / n * 1e6, 2),
                   **({"bookies_cpu_us_per_entry": round(bcpu / n * 1e6, 2)} if bcpu is not None else {}), **extra)


async def measure(uri: str, pids: list[int], args: argparse.Namespace) -> list[dict]:
    """Every run of a round on the cluster at uri (see the module docstring)."""
    from pybk.client import BookKeeper
    from pybk.log import Logs

    from .write import bench_writes
    out = []
    tag = os.urandom(4).hex()   # log names of their own, also on a cluster given by --metadata-uri

    def named(what: str) -> str:
        return f"bench-{what}-{tag}"
    async with await BookKeeper.connect(uri) as bk:
        logs = Logs(bk)

        async def timed(label: str, log: str, fn: Callable[..., Awaitable[tuple[float, list[float]]]], n: int,
                        size: int) -> dict:
            await logs.create(log, password=PASSWORD)
            async with await logs.open_writer(log, password=PASSWORD) as w:
                await fn(w, min(n, 20_000), size)   # warm-up: streams, caches, the next segment made ahead
                cpu0, bcpu0 = time.process_time(), cpu_seconds(pids)
                seconds, lat = await fn(w, n, size)
                cpu, bcpu = time.process_time() - cpu0, cpu_seconds(pids) - bcpu0
            return _row(label, n, size, seconds, lat, cpu, bcpu if pids else None)

        parts = set(args.only or PARTS)
        if "pipelined" in parts:
            out.append(await timed("log 100 B pipelined", named("pipelined"), pipelined, args.records, RECORD))
        if "append-many" in parts:
            out.append(await timed("log 100 B append_many", named("many"), many, args.many_records, RECORD))
        ledger = argparse.Namespace(ensemble=3, write_quorum=3, ack_quorum=2, size=KIB, entries=args.kib_records,
                                    window1_entries=args.latency_records)
        if "kib" in parts:
            out.append(await timed("log 1 KiB pipelined", named("kib"), pipelined, args.kib_records, KIB))
            out += await bench_writes(uri, pids, ledger, [256])
        if "end-to-end" in parts:
            ledger.size = RECORD
            out += await bench_writes(uri, pids, ledger, [1], label=" 100 B")
            out += await end_to_end_runs(uri, logs, named, args)
        if "takeover" in parts:
            await logs.create(named("takeover"), password=PASSWORD)
            times = sorted(await takeovers(logs, uri, named("takeover"), args.takeovers))
            out.append({"run": "log forced takeover: open_writer -> first ack", "takeovers": len(times),
                        "p50_ms": round(statistics.median(times) * 1000, 1), "max_ms": round(times[-1] * 1000, 1)})
        if "etcd" in parts:
            out.append({"run": "log etcd bytes per idle log", "bytes": await idle_log_bytes(logs, named("idle"))})
        if "segments" in parts:
            written, opened, found = await open_many_segments(logs, named("segments"), args.segments)
            out.append({"run": f"log open of {args.segments} segments", "segments": args.segments,
                        "open_writer_ms": round(opened * 1000, 1), "find_segment_ms": round(found * 1000, 1),
                        "etcd_write_s": round(written, 1)})
    return out


def ratios(results: list[dict]) -> list[dict]:
    """The ratios the goals are stated in, from one round's rows."""
    by = {r["run"]: r for r in results}
    out = []
    kib, ledger = by.get("log 1 KiB pipelined"), by.get("pybk E3/Qw3/Qa2 window=256")
    if kib and ledger:
        out.append({"run": "log 1 KiB / ledger window=256", "peer": "ledger",
                    "throughput_ratio": round(kib["entries_per_s"] / ledger["entries_per_s"], 3),
                    "p50_ratio": round(kib["p50_ms"] / ledger["p50_ms"], 3) if ledger["p50_ms"] else None})
    peer = next((r for r in results if r["run"].startswith("nats-jetstream")), None)
    if peer:
        for name in ("log 100 B pipelined", "log 100 B append_many"):
            if name not in by:
                continue
            out.append({"run": f"{name} / JetStream", "peer": peer["run"],
                        "throughput_ratio": round(by[name]["entries_per_s"] / peer["entries_per_s"], 3),
                        "p50_ratio": None})
    return out


def one_round(args: argparse.Namespace) -> list[dict]:
    from .write import cluster
    with cluster(args) as (uri, pids):
        results = eventloop.run(measure(uri, pids, args))
    if args.peer_nats and {"pipelined", "append-many"} & set(args.only or PARTS):   # their peer
        from .peer_nats import run_jetstream
        results += run_jetstream([(args.peer_window, args.records)], RECORD, args.dir)
    return results + ratios(results)


NUMERIC_SKIP = {"run", "entries", "size", "window", "ledger_id", "peer", "segments", "takeovers", "stream_messages"}


def medians(rounds: list[list[dict]]) -> list[dict]:
    """Per run name, the median of each figure over the rounds (each round's value too)."""
    out = []
    for name, rows in by_run(rounds).items():
        row: dict = {"run": name, "rounds": len(rows)}
        for key, first in rows[0].items():
            values = [r.get(key) for r in rows]
            if key not in NUMERIC_SKIP and isinstance(first, (int, float)):
                present = [v for v in values if v is not None]
                row[key] = round(statistics.median(present), 3) if present else None
                if len(rows) > 1:
                    row[key + "_rounds"] = values
            elif key != "run":
                row[key] = first
        out.append(row)
    return out


def goals(middle: list[dict]) -> list[str]:
    """Each goal of docs/logs.md with the median figure and whether it is met."""
    by = {r["run"]: r for r in middle}
    lines = []

    def check(text: str, value: float | None, ok: bool | None) -> None:
        verdict = "n/a" if value is None or ok is None else ("met" if ok else "MISSED")
        lines.append(f"{text}: {verdict}")
    pipelined_row, jet = by.get("log 100 B pipelined"), by.get("log 100 B pipelined / JetStream")
    if pipelined_row:
        check(f"100 B pipelined >= 10x JetStream records/s ({jet['throughput_ratio']:.2f}x)" if jet else
              "100 B pipelined >= 10x JetStream records/s (run with --peer-nats)",
              jet and jet["throughput_ratio"], jet and jet["throughput_ratio"] >= 10)
    m = by.get("log 100 B append_many")
    if m:
        check(f"append_many >= 1,000,000 records/s ({m['entries_per_s']:,.0f})", m["entries_per_s"],
              m["entries_per_s"] >= 1_000_000)
    k = by.get("log 1 KiB / ledger window=256")
    if k:
        check(f"1 KiB records/s >= ledger entries/s ({k['throughput_ratio']:.2f}x)", k["throughput_ratio"],
              k["throughput_ratio"] >= 1)
    w1 = next((r for n, r in by.items() if n.endswith("window=1 100 B")), None)
    e2e = next((r for n, r in by.items() if n.startswith("log end-to-end append")), None)
    if e2e and w1:
        check(f"end-to-end p50 {e2e['p50_ms']:.2f} ms within 2 ms of window-1 add p50 {w1['p50_ms']:.2f} ms",
              e2e["p50_ms"], e2e["p50_ms"] <= w1["p50_ms"] + 2)
        check(f"end-to-end p99 {e2e['p99_ms']:.2f} ms <= 10 ms", e2e["p99_ms"], e2e["p99_ms"] <= 10)
    t = by.get("log forced takeover: open_writer -> first ack")
    if t:
        check(f"takeover p50 {t['p50_ms']:.1f} ms <= 100 ms", t["p50_ms"], t["p50_ms"] <= 100)
    b = by.get("log etcd bytes per idle log")
    if b:
        check(f"etcd bytes per idle log {b['bytes']:.0f} <= 1024", b["bytes"], b["bytes"] <= 1024)
    o = next((r for n, r in by.items() if n.startswith("log open of")), None)
    if o:
        check(f"open_writer of a log of {o['segments']} segments {o['open_writer_ms']:.1f} ms <= 1000 ms",
              o["open_writer_ms"], o["open_writer_ms"] <= 1000)
    return lines


def format_row(r: dict) -> str:
    from .write import format_result
    if "entries_per_s" in r or "peer" in r:
        if not r["run"].startswith("log"):
            return format_result(r)
        line = format_result(r).replace(" entries ", " records ").replace("entries/s", "records/s")
        return line + (f"; reader CPU per record {r['reader_cpu_us_per_record']} us"
                       if "reader_cpu_us_per_record" in r else "")
    return r["run"] + ": " + ", ".join(f"{k} {v}" for k, v in r.items() if k not in ("run", "rounds")
                                       and not k.endswith("_rounds"))


def run(args: argparse.Namespace) -> int:
    command = "pybk " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    from .peer_nats import refuse_rounds
    refused = refuse_rounds("pybk bench log", args.repeat, args.peer_nats)
    if refused is not None:
        return refused
    started = time.time()
    load = os.getloadavg()[0]
    rounds = [one_round(args) for _ in range(args.repeat)]
    middle = medians(rounds)
    checked = goals(middle)
    if args.output == "json":
        print(json.dumps({"command": command, "date": time.strftime("%Y-%m-%d", time.gmtime(started)),
                          "load_before": round(load, 2), "load_after": round(os.getloadavg()[0], 2),
                          "repeat": len(rounds), "rounds": [{"round": i, "results": r} for i, r in
                                                            enumerate(rounds, 1)],
                          "medians": middle, "goals": checked}))
        return 0
    for i, results in enumerate(rounds, 1):
        print(f"round {i} of {len(rounds)}:")
        for r in results:
            print("  " + format_row(r))
    print(f"medians of {len(rounds)} rounds:")
    for r in middle:
        print("  " + format_row(r))
    print("goals:")
    for line in checked:
        print("  " + line)
    print(f"load average: {load:.2f} before, {os.getloadavg()[0]:.2f} after (1 min)")
    print(f"command: {command}")
    return 0

