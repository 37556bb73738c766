"""`make demo`: a tour of pybk on a local cluster, step by step, with the commands it runs.

Starts etcd and 3 bookies from examples/cluster.yaml, writes a few ledgers of sample events
(ensemble 3, write quorum 3, ack quorum 2), reads them back and checks them, shows the shell's
view of the cluster, runs the per-ledger statistics Spark job (spark/ledger_stats.py) over the
ledgers with a local Spark, and stops everything, also on Ctrl-C or failure. Without Java the
Spark step is skipped with a note naming the package to install.

With --secure the cluster runs `pybk local up --secure` (TLS, etcd auth, tokens): every client
step stays the same, taking its credentials from the cluster's local.json.

    python -m pybk.demo [--data-dir DIR] [--keep] [--secure]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pybk.local.client import LocalClient, read_client

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "cluster.yaml"
PASSWORD = b"demo-password"
STREAMS = {"orders": 40, "payments": 25, "shipments": 15}

FALLBACK_MANIFEST = """apiVersion: pybk.io/v1alpha1
kind: BookieCluster
metadata:
  name: demo
spec:
  replicas: 3
  ledgerDefaults: {ensemble: 3, writeQuorum: 3, ackQuorum: 2}
"""


def say(text: str = "") -> None:
    print(text, flush=True)


def step(n: int, total: int, title: str) -> None:
    say()
    say(f"[{n}/{total}] {title}")


def pybk(*args: str, check: bool = True) -> str:
    """Run `pybk ARGS` as a user would, echoing the command and its output."""
    say(f"  $ pybk {' '.join(shlex.quote(a) for a in args)}")
    proc = subprocess.run([sys.executable, "-m", "pybk.cli", *args], capture_output=True, text=True)
    out = (proc.stdout + proc.stderr).rstrip()
    if out:
        say("\n".join("    " + line for line in out.splitlines()))
    if check and proc.returncode != 0:
        raise SystemExit(f"demo failed: `pybk {' '.join(args)}` exited with {proc.returncode}")
    return proc.stdout


def sample_event(stream: str, i: int, rng: random.Random) -> bytes:
    """One JSON event of a made-up shop."""
    event = {"stream": stream, "seq": i, "ts_ms": 1_700_000_000_000 + i * 1000 + rng.randrange(1000),
             "customer": f"c-{rng.randrange(100):03d}"}
    if stream == "orders":
        event["amount_cents"] = rng.randrange(500, 50_000)
    elif stream == "payments":
        event["method"] = rng.choice(["card", "transfer", "wallet"])
    else:
        event["carrier"] = rng.choice(["post", "courier"])
    return json.dumps(event, separators=(",", ":")).encode()


async def write_and_read(cluster: LocalClient) -> dict[str, tuple[int, list[bytes]]]:
    """Write one ledger per event stream, close it, read it back with fencing, compare."""
    from pybk.client import BookKeeper, DigestType

    rng = random.Random(7)
    written: dict[str, tuple[int, list[bytes]]] = {}
    async with await BookKeeper.connect(cluster.metadata_uri, security=cluster.security) as bk:
        for stream, count in STREAMS.items():
            lh = await bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2, digest=DigestType.CRC32C,
                                        password=PASSWORD, metadata={"stream": stream.encode()})
            events = [sample_event(stream, i, rng) for i in range(count)]
            started = time.perf_counter()
            ids = await asyncio.gather(*(lh.add_entry_async(e) for e in events))
            await lh.close()
            ms = (time.perf_counter() - started) * 1000
            assert list(ids) == list(range(count)), f"entry ids {ids} are not 0..{count - 1}"
            say(f"  ledger {lh.ledger_id:<4} {stream:<10} {count:>3} events written (each stored on 3 bookies, "
                f"acked once 2 had it), ledger closed ({ms:.0f} ms)")
            written[stream] = (lh.ledger_id, events)
        say("  reading every ledger back (each entry's digest is checked on read):")
        for stream, (ledger_id, events) in written.items():
            rh = await bk.open_ledger(ledger_id, password=PASSWORD)
            got = [bytes(e.data) async for e in rh.read_entries(0, rh.last_add_confirmed)]
            await rh.close()
            if got != events:
                raise SystemExit(f"demo failed: ledger {ledger_id} read back differs from what was written")
            say(f"  ledger {ledger_id:<4} {stream:<10} {len(got):>3} events read back, identical: "
                f"{got[0].decode()[:70]}...")
    return written


def spark_stats(uri: str, ledgers: dict[str, tuple[int, list[bytes]]], data_dir: Path | None = None) -> str | None:
    """Run the statistics job as a user would; check its numbers against what was written.
    With data_dir, the job runs as in that local cluster's directory ($PYBK_LOCAL_DIR), so it
    finds the cluster's credentials in its local.json. Returns a note when the step could not
    run (no Java), None when it ran."""
    from pybk.spark.session import java_problem
    problem = java_problem()
    if problem:
        say(f"  skipped: {problem}")
        return f"skipped: {problem}"
    job = ROOT / "spark" / "ledger_stats.py"
    shown = _display_path(job) if job.exists() else "-m pybk.spark.jobs"
    args = ["-m", uri, "--ledgers", "all", "--password", PASSWORD.decode()]
    say(f"  $ python {shown} {' '.join(shlex.quote(a) for a in args)}")
    argv = [sys.executable, str(job)] if job.exists() else [
        sys.executable, "-c", "import sys; from pybk.spark.jobs import stats_main; sys.exit(stats_main(sys.argv[1:]))"]
    say("    (starting a local[2] Spark session takes a few seconds)")
    env = {**os.environ, "PYBK_LOCAL_DIR": str(data_dir)} if data_dir else None
    proc = subprocess.run([*argv, *args], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        say("\n".join("    " + line for line in proc.stderr.strip().splitlines()[-15:]))
        raise SystemExit(f"demo failed: the Spark statistics job exited with {proc.returncode}")
    say("\n".join("    " + line for line in proc.stdout.rstrip().splitlines()))
    expected = {lid: (len(events), sum(map(len, events))) for lid, events in ledgers.values()}
    table = _parse_stats(proc.stdout)
    if table != expected:
        raise SystemExit(f"demo failed: Spark counted {table}, but {expected} was written")
    say("  Spark's counts match what was written, ledger by ledger.")
    return None


def _parse_stats(text: str) -> dict[int, tuple[int, int]]:
    """ledger_id -> (entries, bytes) from the job's table output."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 5 and all(p.lstrip("-").isdigit() for p in parts):
            out[int(parts[0])] = (int(parts[1]), int(parts[2]))
    return out


def _display_path(path: Path) -> str:
    """The path relative to the current directory when it is below it (shorter to read)."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pybk.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", help="where the demo cluster keeps its data (default: a new temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the data dir afterwards")
    parser.add_argument("--no-spark", action="store_true", help="skip the Spark statistics job")
    parser.add_argument("--secure", action="store_true",
                        help="run the cluster with `pybk local up --secure` (TLS, etcd auth, tokens)")
    args = parser.parse_args(argv)
    data_dir = Path(args.data_dir or tempfile.mkdtemp(prefix="pybk-demo-")).resolve()
    manifest = EXAMPLE
    if not manifest.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        manifest = data_dir / "demo-cluster.yaml"
        manifest.write_text(FALLBACK_MANIFEST)
    total = 6
    say("pybk demo: replicated, append-only ledgers on a local cluster")
    say(f"  data dir: {data_dir}")
    started = False
    try:
        shown = _display_path(manifest)
        step(1, total, f"start etcd and 3 bookies from the BookieCluster manifest {shown}")
        say("  (the same manifest the Kubernetes operator takes; each bookie gets a gRPC data port,")
        say("   an admin HTTP port, and its own journal + ledger dirs under the data dir)")
        for line in manifest.read_text().splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                say(f"    | {line}")
        if args.secure:
            say("  --secure: a throwaway CA, certificates, tokens and etcd users are created under")
            say("   DIR/security/; every port speaks TLS and every client must present a credential")
        pybk("local", "up", "-f", shown, "--data-dir", str(data_dir), "--detach", *(["--secure"] if args.secure else []))
        started = True
        cluster = read_client(data_dir)
        uri = cluster.metadata_uri

        step(2, total, "the bookies registered themselves in etcd")
        pybk("shell", "listbookies", "--data-dir", str(data_dir))

        step(3, total, "write a ledger per event stream with E3/Qw3/Qa2, then read each back")
        ledgers = asyncio.run(write_and_read(cluster))

        step(4, total, "what the shell sees: ledgers, one ledger's metadata, its first events")
        pybk("shell", "listledgers", "--data-dir", str(data_dir))
        first = ledgers["orders"][0]
        pybk("shell", "ledgermetadata", str(first), "--data-dir", str(data_dir))
        pybk("shell", "readledger", str(first), "--last", "4", "--password", PASSWORD.decode(),
             "--data-dir", str(data_dir))

        step(5, total, "per-ledger statistics with Spark: the `pybk` data source reads entries straight "
                       "from the bookies")
        spark_note = spark_stats(uri, ledgers, data_dir) if not args.no_spark else "skipped (--no-spark)"

        step(6, total, "stop the cluster: autorecovery and bookies first, then etcd")
        pybk("local", "down", "--data-dir", str(data_dir))
        started = False
        say()
        say("demo finished: every acked event was read back identical.")
        if spark_note:
            say(f"  Spark step: {spark_note}")
        say("  try it yourself: pybk local up -f examples/cluster.yaml   (then, in another terminal,")
        say("  pybk shell simpletest; pybk shell listledgers; Ctrl-C or `pybk local down` stops it)")
        say("  `pybk local up --secure` adds TLS, etcd auth and tokens; the same commands keep working")
        return 0
    except KeyboardInterrupt:
        say("\ninterrupted")
        return 130
    finally:
        if started:
            subprocess.run([sys.executable, "-m", "pybk.cli", "local", "down", "--data-dir", str(data_dir)],
                           capture_output=True)
        if not args.keep and not args.data_dir:
            import shutil
            shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
