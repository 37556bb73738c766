"""`pybk bench spark`: scan ledgers with Spark local[2] through the `pybk` data source.

Starts etcd and bookies on loopback (or uses --metadata-service-uri), writes --size bytes of
--entry-size entries into --ledgers ledgers with the client, then times a Spark scan that
touches every payload (count and sum of payload lengths). Prints MB/s and the exact command.

With --vs-parquet, Spark first writes the same rows to a Parquet copy in a temp dir, then the
pybk scan and the same aggregate over the Parquet copy run alternately in the same session,
after one untimed scan of each (the JVM compiles the scan's code during the first runs); it
prints both medians and the ratio pybk / Parquet, which holds up on a noisy shared machine
where absolute MB/s do not. Every entry has its own random payload, so Parquet can neither
dictionary-encode nor compress the copy.

With --log, the data is a named log of --record-size records (100 bytes: many records per entry)
instead, scanned with option log (columns log, offset, timestamp, key, payload); the 1 KiB-entry
ledger comparison (--ledger-size) runs after it in the same session, so both ratios are printed
side by side, with records (rows) per second. --reader python scans the log with the Python data
source instead of pybk's JVM reader (docs/spark.md). --columns payload reads the log through a narrower
schema (the one column the aggregate needs, as Parquet's scan reads); --floor times a Python source
that yields ready-made batches of the same columns (built once per Python worker), so the ratio
left between the two is the read's.
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
from pybk import eventloop

PASSWORD = b"bench"  # the benchmark ledgers' (a secured cluster refuses ledgers without one)

def _size(text: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = text.strip().lower().rstrip("ib").rstrip("b")
    if t and t[-1] in units:
        return int(float(t[:-1]) * units[t[-1]])
    return int(t)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--size", default=None,
                        help="bytes of payload to scan (default 1GiB, 256MiB with --vs-parquet; e.g. 64MiB)")
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
    parser.add_argument("--runs", type=int, default=None,
                        help="timed scans (default 2, the best is reported; with --vs-parquet 5 of each, "
                             "alternating, medians reported)")
    parser.add_argument("--vs-parquet", action="store_true",
                        help="also scan a Parquet copy of the same rows in the same session, alternating "
                             "with the pybk scans, and print the ratio pybk / Parquet")
    parser.add_argument("--aggregate", choices=("sum-length", "count"), default="sum-length",
                        help="what each scan computes: count and sum(length(payload)) (default), or count "
                             "only (Spark may then skip the payload column)")
    parser.add_argument("--log", action="store_true",
                        help="scan a named log of --record-size records (many per entry) instead of ledgers; "
                             "with --vs-parquet the 1 KiB-entry ledger ratio is measured too")
    parser.add_argument("--record-size", type=int, default=100, help="payload bytes per log record (default 100)")
    parser.add_argument("--floor", action="store_true",
                        help="with --log --vs-parquet: also time a Python data source that only yields ready-made "
                             "Arrow batches of the log scan's columns (Spark's own cost for that schema) against "
                             "Parquet")
    parser.add_argument("--columns", default=None,
                        help="with --log: scan only these log columns, comma-separated (e.g. payload), given "
                             "to Spark as the read's schema; the floor source (--floor) yields the same ones")
    parser.add_argument("--reader", choices=("auto", "python"), default="auto",
                        help="with --log: who reads the scan: auto (default: pybk's JVM reader when its jar "
                             "builds) or python (the Python data source)")
    parser.add_argument("--bytes-per-partition", default=None,
                        help="with --log: the source's bytesPerPartition (default: the source's default)")
    parser.add_argument("--ledger-size", default="256MiB",
                        help="with --log --vs-parquet: bytes of 1 KiB entries for the ledger ratio (default 256MiB, as without --log)")
    parser.add_argument("--metadata-service-uri", default=None,
                        help="use this running cluster instead of starting one")
    parser.add_argument("--dir", default=None, help="data directory for the started cluster (default: temp)")
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text")


async def _write(uri: str, args: argparse.Namespace, total: int) -> tuple[list[int], float]:
    from pybk.client import BookKeeper
    entries = max(1, total // args.entry_size)
    per_ledger = [entries // args.ledgers + (1 if i < entries % args.ledgers else 0)
                  for i in range(args.ledgers)]
    bk = await BookKeeper.connect(uri)
    started = time.perf_counter()

    async def one(n: int) -> int:
        lh = await bk.create_ledger(ensemble=args.ensemble, write_quorum=args.write_quorum,
                                    ack_quorum=args.ack_quorum, password=PASSWORD)
        window: list = []
        for _ in range(n):
            window.append(lh.add_entry_async(os.urandom(args.entry_size)))
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


LOG_NAME = "bench-spark"


async def _write_log(uri: str, args: argparse.Namespace, total: int) -> tuple[int, float]:
    """A log of total // record_size random records (append_many: packed entries); returns the
    record count and the seconds it took."""
    from pybk.client import BookKeeper
    from pybk.log import LogConfig, Logs
    n = max(1, total // args.record_size)
    bk = await BookKeeper.connect(uri)
    started = time.perf_counter()
    try:
        logs = Logs(bk)
        if LOG_NAME in await logs.list():
            await logs.delete(LOG_NAME, password=PASSWORD)
        await logs.create(LOG_NAME, LogConfig(ensemble=args.ensemble, write_quorum=args.write_quorum,
                                              ack_quorum=args.ack_quorum), password=PASSWORD)
        async with await logs.open_writer(LOG_NAME, password=PASSWORD) as w:
            step = 50_000
            for i in range(0, n, step):
                blob = os.urandom(args.record_size * min(step, n - i))
                await w.append_many([blob[k:k + args.record_size] for k in range(0, len(blob), args.record_size)])
    finally:
        await bk.close()
    return n, time.perf_counter() - started


def _columns_schema(args: argparse.Namespace) -> str | None:
    """The DDL schema of --columns (None: the source's own)."""
    from pybk.spark.logscan import LOG_COLUMNS
    if not args.columns:
        return None
    return ", ".join(f"{c.strip()} {LOG_COLUMNS[c.strip()][0]}" for c in args.columns.split(","))


def _log_frame(spark, uri: str, args: argparse.Namespace):
    r = spark.read.format("pybk").option("metadataServiceUri", uri).option("log", LOG_NAME)
    if _columns_schema(args):
        r = r.schema(_columns_schema(args))
    if args.bytes_per_partition:
        r = r.option("bytesPerPartition", str(_size(args.bytes_per_partition)))
    return r.option("reader", args.reader).load()


FLOOR_BATCH_ROWS = 35_840   # one 4 MiB sub-range of 100-byte records, as the log scan hands Spark
FLOOR_BATCHES: dict = {}    # the floor source's one batch, per Python worker (at most one kept)


def _floor_source(rows: int, record_size: int, partitions: int):
    """A Python data source whose partitions yield one ready-made batch of the log scan's columns
    over and over (`rows` in all): what Spark's Python data source path costs for that schema,
    with no reading at all."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from pybk.spark.logscan import LOG_SCHEMA, Columns, projection

    class Part(InputPartition):
        def __init__(self, rows: int):
            self.rows = rows

    class Reader(DataSourceReader):
        def __init__(self, schema):
            self.schema = projection(schema)

        def partitions(self):
            return [Part(rows // partitions + (1 if i < rows % partitions else 0)) for i in range(partitions)]

        def read(self, part):
            from pybk.bench import spark as bench   # imported: its cache outlives the task
            from pybk.spark.runtime import freeze_once
            key = (record_size, self.schema)
            if key not in bench.FLOOR_BATCHES:   # built once per Python worker, as a reader's client is
                from pybk.log import codec
                blob = os.urandom(FLOOR_BATCH_ROWS * record_size)
                b = codec.BatchBuilder()
                b.add_many([blob[i:i + record_size] for i in range(0, len(blob), record_size)], 1_700_000_000_000)
                body = b.build(0)
                cols = Columns(LOG_NAME, self.schema)
                cols.add_chunk(body, [0], [len(body)], 0, 0, 1 << 62)
                bench.FLOOR_BATCHES.clear()
                bench.FLOOR_BATCHES[key] = cols.batch()
            batch = bench.FLOOR_BATCHES[key]
            freeze_once()   # as the pybk scan does (runtime.drive)
            left = part.rows
            while left > 0:
                yield batch if left >= batch.num_rows else batch.slice(0, left)
                left -= batch.num_rows

    class Floor(DataSource):
        @classmethod
        def name(cls) -> str:
            return "pybk-bench-floor"

        def schema(self) -> str:
            return LOG_SCHEMA

        def reader(self, schema):
            return Reader(schema)
    return Floor


def _pybk_frame(spark, uri: str, ledgers: list[int], args: argparse.Namespace):
    r = (spark.read.format("pybk").option("metadataServiceUri", uri).option("password", PASSWORD.decode())
         .option("ledgers", ",".join(map(str, ledgers))))
    if args.entries_per_partition:
        r = r.option("entriesPerPartition", str(args.entries_per_partition))
    return r.load()


def _scan(df, args: argparse.Namespace) -> tuple[int, int | None, float]:
    """(rows, sum of payload lengths or None, seconds) of one aggregate over df."""
    from pyspark.sql import functions as F
    started = time.perf_counter()
    if args.aggregate == "count":
        return df.count(), None, time.perf_counter() - started
    row = df.agg(F.count(F.lit(1)).alias("n"), F.sum(F.length("payload")).alias("b")).collect()[0]
    return int(row["n"]), int(row["b"] or 0), time.perf_counter() - started


def _descendants(pid: int) -> list[int]:
    """pid's child processes, recursively (Linux /proc): the JVM's Python workers."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def _cpu(pids: list[int]) -> float:
    """CPU seconds of pids, also of their waited-for children (finished Python workers); 0 for
    processes that are gone."""
    total = 0.0
    for pid in pids:
        try:
            f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(x) for x in f[11:15]) / os.sysconf("SC_CLK_TCK")
    return total


class CpuMeter:
    """CPU seconds per part (Spark's JVM, its Python workers, the bookies) between two marks:
    where a scan's time goes."""

    def __init__(self, jvm_pid: int, bookie_pids: list[int]):
        self.jvm_pid = jvm_pid
        self.bookie_pids = bookie_pids

    def sample(self) -> dict[str, float]:
        workers = _descendants(self.jvm_pid)
        return {"jvm": _cpu([self.jvm_pid]) - _cpu_children(self.jvm_pid), "python": _cpu(workers),
                "bookies": _cpu(self.bookie_pids)}


def _cpu_children(pid: int) -> float:
    """The waited-for children's part of _cpu([pid])."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(x) for x in f[13:15]) / os.sysconf("SC_CLK_TCK")


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    return s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2


def _compare(spark, pybk_frame, rows: int, nbytes: int, runs: int, meter: CpuMeter, args: argparse.Namespace,
             vs_parquet: bool) -> dict | str:
    """Time `runs` scans of pybk_frame (alternating with a Parquet copy of it when vs_parquet,
    after one untimed scan of each); the figures, or an error saying what a scan saw wrongly."""
    import shutil
    frames = {"pybk": pybk_frame}
    pq_dir = None
    if vs_parquet:
        pq_dir = tempfile.mkdtemp(prefix="pybk-bench-parquet-")
        pybk_frame.write.mode("overwrite").parquet(pq_dir + "/copy")
        frames["parquet"] = spark.read.parquet(pq_dir + "/copy")
    scans: dict[str, list[float]] = {name: [] for name in frames}
    cpus: dict[str, list[dict[str, float]]] = {name: [] for name in frames}
    try:
        for df in frames.values():  # untimed: Spark's JIT and the page cache warm up for both alike
            _scan(df, args)
        for _ in range(runs):
            for name, df in frames.items():
                before = meter.sample()
                n, got, secs = _scan(df, args)
                after = meter.sample()
                cpus[name].append({k: (after[k] - before[k]) / rows * 1e6 for k in after})
                if n != rows or got not in (None, nbytes):
                    return f"the {name} scan saw {n} rows and {got} bytes, expected {rows} and {nbytes}"
                scans[name].append(secs)
    finally:
        if pq_dir:
            shutil.rmtree(pq_dir, ignore_errors=True)
    best = min(scans["pybk"])
    out = {"rows": rows, "bytes": nbytes, "scan_seconds": [round(x, 2) for x in scans["pybk"]],
           "scan_MBps": round(nbytes / best / 1e6, 1), "scan_rows_per_s": round(rows / best),
           "cpu_us_per_row": {name: {k: round(_median([c[k] for c in cs]), 2) for k in cs[0]}
                              for name, cs in cpus.items()}}
    if vs_parquet:
        pybk_med, pq_med = _median(scans["pybk"]), _median(scans["parquet"])
        out.update({
            "scan_median_MBps": round(nbytes / pybk_med / 1e6, 1),
            "scan_median_rows_per_s": round(rows / pybk_med),
            "parquet_seconds": [round(x, 2) for x in scans["parquet"]],
            "parquet_median_MBps": round(nbytes / pq_med / 1e6, 1),
            "parquet_median_rows_per_s": round(rows / pq_med),
            "ratio": round(pq_med / pybk_med, 3),
            "run_ratios": [round(q / p, 3) for p, q in zip(scans["pybk"], scans["parquet"])],
        })
    return out


def _print(label: str, result: dict, args: argparse.Namespace) -> None:
    print(f"{label} scan ({args.master}, {args.aggregate}): runs "
          f"{', '.join(f'{x:.1f} s' for x in result['scan_seconds'])}; best {result['scan_MBps']} MB/s, "
          f"{result['scan_rows_per_s']} rows/s")
    for name, parts in result["cpu_us_per_row"].items():
        print(f"  CPU {name + ':':9} " + ", ".join(f"{k} {v} us" for k, v in parts.items()) + " per row (medians)")
    if "ratio" in result:
        print(f"  parquet: runs {', '.join(f'{x:.1f} s' for x in result['parquet_seconds'])}; median "
              f"{result['parquet_median_MBps']} MB/s, {result['parquet_median_rows_per_s']} rows/s")
        print(f"  pybk/parquet: {result['ratio']} (medians: pybk {result['scan_median_rows_per_s']} rows/s "
              f"{result['scan_median_MBps']} MB/s, Parquet {result['parquet_median_rows_per_s']} rows/s; per run "
              f"{', '.join(map(str, result['run_ratios']))})")


def run(args: argparse.Namespace) -> int:
    from pybk.spark.session import JavaMissingError, local_session
    total = _size(args.size or ("256MiB" if args.vs_parquet else "1GiB"))
    if args.columns:
        from pybk.spark.logscan import LOG_COLUMNS
        names = [c.strip() for c in args.columns.split(",")]
        unknown = [c for c in names if c not in LOG_COLUMNS]
        if unknown or not args.log or (args.aggregate == "sum-length" and "payload" not in names):
            print(f"pybk bench spark: --columns takes log columns ({', '.join(LOG_COLUMNS)}) with --log, and "
                  f"payload among them unless --aggregate count; got {args.columns!r}", file=sys.stderr)
            return 2
    runs = max(1, args.runs or (5 if args.vs_parquet else 2))
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
        parts: list[tuple[str, dict]] = []   # (what was written, figures source)
        written: dict[str, tuple] = {}
        if args.log:
            records, write_s = eventloop.run(_write_log(uri, args, total))
            written["log"] = (records, records * args.record_size, write_s)
        if not args.log or args.vs_parquet:
            ledger_total = _size(args.ledger_size) if args.log else total
            ledgers, write_s = eventloop.run(_write(uri, args, ledger_total))
            entries = ledger_total // args.entry_size
            written["ledgers"] = (entries, entries * args.entry_size, write_s, ledgers)
        try:
            spark = local_session(args.master, "pybk-bench-spark")
        except JavaMissingError as exc:
            print(f"pybk bench spark: {exc}", file=sys.stderr)
            return 2
        meter = CpuMeter(int(spark._jvm.java.lang.ProcessHandle.current().pid()),
                         [p.pid for p in procs[1:] if p.pid])
        if args.log and args.floor:
            records = written["log"][0]
            spark.dataSource.register(_floor_source(records, args.record_size, 8))
            written = {"log": written["log"], "floor": (records, records * args.record_size, 0.0),
                       **{k: v for k, v in written.items() if k != "log"}}
        try:
            for what, w in written.items():
                if what == "floor":
                    floor = spark.read.format("pybk-bench-floor")
                    if _columns_schema(args):
                        floor = floor.schema(_columns_schema(args))
                    got = _compare(spark, floor.load(), w[0], w[1], runs, meter, args, True)
                    if isinstance(got, str):
                        print(f"pybk bench spark: {got}", file=sys.stderr)
                        return 1
                    parts.append((what, got))
                    continue
                frame = _log_frame(spark, uri, args) if what == "log" else _pybk_frame(spark, uri, w[3], args)
                got = _compare(spark, frame, w[0], w[1], runs, meter, args, args.vs_parquet)
                if isinstance(got, str):
                    print(f"pybk bench spark: {got}", file=sys.stderr)
                    return 1
                got.update({"write_seconds": round(w[2], 2), "write_MBps": round(w[1] / w[2] / 1e6, 1)})
                parts.append((what, got))
        finally:
            spark.stop()
        result = {"command": command, "master": args.master, "aggregate": args.aggregate,
                  "load_average": [round(x, 2) for x in os.getloadavg()]}
        for what, got in parts:
            result[what] = got
        if args.output == "json":
            print(json.dumps(result))
            return 0
        print(f"command:      {command}")
        print(f"load average: {', '.join(map(str, result['load_average']))} (at the end)")
        for what, got in parts:
            if what == "floor":
                print("floor:        a Python data source yielding ready-made batches of the log scan's columns")
                _print("floor", got, args)
            elif what == "log":
                print(f"data:         log of {got['rows']} records of {args.record_size} B "
                      f"({got['bytes'] / (1 << 20):.0f} MiB of payload; E{args.ensemble}/Qw{args.write_quorum}"
                      f"/Qa{args.ack_quorum}, {args.bookies} bookies); written in {got['write_seconds']} s")
                _print("log", got, args)
            else:
                print(f"data:         {got['bytes'] / (1 << 20):.0f} MiB in {got['rows']} entries of "
                      f"{args.entry_size} B over {args.ledgers} ledgers (E{args.ensemble}/Qw{args.write_quorum}"
                      f"/Qa{args.ack_quorum}); written in {got['write_seconds']} s")
                _print("ledger", got, args)
        return 0
    finally:
        for p in reversed(procs):
            p.stop()
        if tmp:
            import shutil
            shutil.rmtree(tmp, ignore_errors=True)
