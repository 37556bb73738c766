"""`pybk bench floor`: the latency floor of a window-1 replicated add on this machine.

It runs the shape of `pybk bench write --windows 1` with no pybk in it: N bare gRPC aio servers
(one bidi stream each; every message is appended to a file and fdatasync'd, then answered) and
one client that sends each message to all of them and waits for `--ack-quorum` answers before
sending the next. Whatever latency this shows, no bookie built on Python gRPC can beat on the
same machine; compare it with `pybk bench write` to see what pybk's own work costs.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time

from pybk.bench.stats import cpu_seconds, percentile
from pybk.local.process import free_port

_METHOD = "/pybk.bench.Floor/Append"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--servers", type=int, default=3, help="servers each message goes to (default 3)")
    parser.add_argument("--ack-quorum", type=int, default=2, help="answers awaited per message (default 2)")
    parser.add_argument("--entries", type=int, default=3000, help="messages sent one at a time (default 3000)")
    parser.add_argument("--size", type=int, default=1024 + 30, help="bytes per message (default 1054: a 1 KiB "
                        "entry with its header)")
    parser.add_argument("--no-fsync", action="store_true", help="append without fdatasync")
    parser.add_argument("--dir", default=None, help="where the servers' files go (default: a temp dir)")
    parser.add_argument("-o", "--output", choices=["human", "json"], default="human")
    parser.add_argument("--serve", nargs=2, metavar=("PORT", "FILE"), help=argparse.SUPPRESS)


async def _serve(port: int, path: str, fsync: bool) -> None:
    import grpc

    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o644)

    async def append(requests, context):
        async for message in requests:
            os.write(fd, message)
            if fsync:
                os.fdatasync(fd)
            yield message[:8]

    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "pybk.bench.Floor", {"Append": grpc.stream_stream_rpc_method_handler(append)}),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


async def _measure(ports: list[int], entries: int, size: int, quorum: int) -> tuple[list[float], float]:
    import grpc

    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{p}") for p in ports]
    for ch in channels:
        await asyncio.wait_for(ch.channel_ready(), 30)
    calls = [ch.stream_stream(_METHOD)() for ch in channels]
    loop = asyncio.get_running_loop()
    acks: dict[int, int] = {}
    waiting: dict[int, asyncio.Future] = {}

    async def answers(call) -> None:
        while (answer := await call.read()) is not grpc.aio.EOF:
            seq = int.from_bytes(answer, "big")
            acks[seq] = n = acks.get(seq, 0) + 1
            if n == quorum:
                waiting.pop(seq).set_result(None)
            if n == len(calls):
                del acks[seq]

    readers = [loop.create_task(answers(c)) for c in calls]
    payload = b"x" * max(0, size - 8)
    latencies = []
    cpu0 = time.process_time()
    for seq in range(entries):  # window 1: the next message goes out once this one has a quorum
        message = seq.to_bytes(8, "big") + payload
        waiting[seq] = done = loop.create_future()
        t0 = time.perf_counter()
        for call in calls:
            await call.write(message)
        await done
        latencies.append(time.perf_counter() - t0)
    client_cpu = time.process_time() - cpu0
    for call in calls:
        await call.done_writing()
    for r in readers:
        r.cancel()
    for ch in channels:
        await ch.close()
    return sorted(latencies), client_cpu


def run(args: argparse.Namespace) -> int:
    if args.serve:
        asyncio.run(_serve(int(args.serve[0]), args.serve[1], not args.no_fsync))
        return 0
    if not 1 <= args.ack_quorum <= args.servers:
        print("pybk bench floor: --ack-quorum must be between 1 and --servers", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="pybk-floor-", dir=args.dir) as tmp:
        ports = [free_port() for _ in range(args.servers)]
        procs = [subprocess.Popen([sys.executable, "-m", "pybk.cli", "bench", "floor", "--serve", str(p),
                                   os.path.join(tmp, f"server-{i}.log")] + (["--no-fsync"] if args.no_fsync else []))
                 for i, p in enumerate(ports)]
        try:
            cpu_before = cpu_seconds([p.pid for p in procs])
            lat, client_cpu = asyncio.run(_measure(ports, args.entries, args.size, args.ack_quorum))
            server_cpu = cpu_seconds([p.pid for p in procs]) - cpu_before
        finally:
            for p in procs:
                p.kill()
                p.wait()
    result = {"servers": args.servers, "ack_quorum": args.ack_quorum, "entries": args.entries, "size": args.size,
              "fsync": not args.no_fsync, "p50_ms": percentile(lat, 0.5) * 1e3, "p99_ms": percentile(lat, 0.99) * 1e3,
              "client_cpu_us": client_cpu / args.entries * 1e6, "servers_cpu_us": server_cpu / args.entries * 1e6}
    if args.output == "json":
        print(json.dumps(result))
    else:
        print(f"bare gRPC aio, {args.servers} servers, ack quorum {args.ack_quorum}, window 1, {args.size} B, "
              f"fdatasync {'on' if result['fsync'] else 'off'}: latency p50 {result['p50_ms']:.2f} ms, "
              f"p99 {result['p99_ms']:.2f} ms; CPU per message: client {result['client_cpu_us']:.1f} us, "
              f"servers {result['servers_cpu_us']:.1f} us")
        print("command: pybk bench " + " ".join(sys.argv[sys.argv.index("floor"):]))
    return 0
