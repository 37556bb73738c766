"""`pybk bench floor`: the latency floor of a replicated add on this machine.

It runs the shape of `pybk bench write --windows 1` with no pybk in it: N bare gRPC servers
(one bidi stream each; every message is appended to a file and made durable, then answered) and
one client that sends each message to all of them and waits for `--ack-quorum` answers before
sending the next. Whatever latency this shows, no bookie built on Python gRPC can beat on the
same machine; compare it with `pybk bench write` to see what pybk's own work costs. With
`--rate` the client sends at a steady pace instead, whatever is in flight (a log's writer at
1,000 records/s is this shape): the floor of `pybk bench log`'s end-to-end run.

The variants drive the same HTTP/2 transport in other ways (`--client`, `--server`, `--loop`,
`--fsync`, `--grpc-option`; gRPC's environment variables such as GRPC_POLL_STRATEGY reach the
servers too), so a change to pybk's client or bookie can be measured here first.
"""
from __future__ import annotations

import argparse
import asyncio
import enum
import json
import os
import queue
import select
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable

from pybk.bench.stats import cpu_seconds, percentile

_METHOD = "/pybk.bench.Floor/Append"
_METHOD_ONE = "/pybk.bench.Floor/AppendOne"


class Client(enum.StrEnum):
    """How the client drives its streams (described in _CLIENTS)."""
    AIO = "aio"
    AIO_GATHER = "aio-gather"
    AIO_ITERATOR = "aio-iterator"
    AIO_UNARY = "aio-unary"
    NGH2 = "ngh2"
    SYNC = "sync"
    SYNC_UNARY = "sync-unary"


class Server(enum.StrEnum):
    """How a server serves its stream (described in _SERVERS)."""
    AIO = "aio"
    AIO_CONTEXT = "aio-context"
    NGH2 = "ngh2"
    SYNC = "sync"


class Loop(enum.StrEnum):
    """The event loop an aio side runs on."""
    ASYNCIO = "asyncio"
    UVLOOP = "uvloop"


class Fsync(enum.StrEnum):
    """How a server makes each message durable (described in _FSYNCS)."""
    FDATASYNC = "fdatasync"
    DSYNC = "dsync"
    NONE = "none"


_CLIENTS = {"aio": "grpc.aio, the three writes awaited one after another (the baseline)",
            "aio-gather": "grpc.aio, the three writes started together and awaited with asyncio.gather",
            "aio-iterator": "grpc.aio, each stream fed by an async generator reading an asyncio.Queue "
                            "(pybk's BookieClient sends so)",
            "aio-unary": "grpc.aio, one unary call per message and server, answers counted in done callbacks",
            "ngh2": "pybk's own gRPC stream on libnghttp2 (pybk.transport.ngh2_client, BookieClient's Add "
                    "stream): messages written and answers read on the event loop, no grpc.aio",
            "sync": "grpc's synchronous API: a request queue and a reader thread per stream",
            "sync-unary": "grpc's synchronous API, one unary call (future) per message and server, answers "
                          "counted in done callbacks on gRPC's channel thread"}
_SERVERS = {"aio": "grpc.aio server, an async generator per stream",
            "aio-context": "grpc.aio server reading and writing with context.read and context.write "
                           "(pybk's bookie writes its answers so)",
            "ngh2": "pybk's gRPC server connections on libnghttp2 (pybk.transport.ngh2_server, the bookie's): "
                    "messages read and answers written on the event loop, no grpc.aio",
            "sync": "grpc.server with a thread pool: a thread per stream iterating its requests"}
_FSYNCS = {"fdatasync": "os.write then os.fdatasync (pybk's journal)",
           "dsync": "one os.write to a file opened with O_DSYNC", "none": "os.write only"}


def _listed(described: dict[str, str]) -> str:
    return "; ".join(f"{name}: {what}" for name, what in described.items())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = ("gRPC's own environment variables (GRPC_POLL_STRATEGY=epoll1|poll, GRPC_EXPERIMENTS) reach "
                     "the client and the servers: prefix the command with them to measure them. "
                     "grpc.experimental.ChannelOptions.SingleThreadedUnaryStream is not a variant: it only "
                     "changes unary-stream calls of the synchronous API, a shape a replicated add does not have.")
    parser.add_argument("--servers", type=int, default=3, help="servers each message goes to (default 3)")
    parser.add_argument("--ack-quorum", type=int, default=2, help="answers awaited per message (default 2)")
    parser.add_argument("--entries", type=int, default=3000, help="messages sent one at a time (default 3000)")
    parser.add_argument("--size", type=int, default=1024 + 30, help="bytes per message (default 1054: a 1 KiB "
                        "entry with its header)")
    parser.add_argument("--rate", type=float, default=None, metavar="PER_SECOND",
                        help="send messages at this pace, each whatever is in flight, instead of one at a time "
                        "(the shape of a log's writer at a steady rate; not with the sync clients)")
    parser.add_argument("--client", type=Client, choices=list(Client), default=Client.AIO,
                        help="how the client drives its streams: " + _listed(_CLIENTS))
    parser.add_argument("--server", type=Server, choices=list(Server), default=Server.AIO,
                        help="how the servers serve their stream: " + _listed(_SERVERS))
    parser.add_argument("--loop", type=Loop, choices=list(Loop), default=Loop.ASYNCIO, help="event loop of the aio "
                        "client and aio servers (uvloop must be installed; grpc.aio wakes the loop through a "
                        "socket it watches with add_reader, which uvloop supports)")
    parser.add_argument("--server-loop", type=Loop, choices=list(Loop), default=None, help="event loop of the aio "
                        "servers alone (default: --loop), to see which side a loop helps")
    parser.add_argument("--fsync", type=Fsync, choices=list(Fsync), default=Fsync.FDATASYNC,
                        help="how a server makes each message durable: " + _listed(_FSYNCS))
    parser.add_argument("--no-fsync", action="store_true", help="same as --fsync none")
    parser.add_argument("--grpc-option", action="append", default=[], metavar="NAME=VALUE",
                        help="a gRPC channel argument given to the client's channels and the servers, e.g. "
                        "grpc.enable_retries=0, grpc.minimal_stack=1, grpc.enable_channelz=0, "
                        "grpc.http2.write_buffer_size=0 (integers are passed as integers; repeat for more)")
    parser.add_argument("--gc-threshold", type=int, default=None, metavar="N", help="in the client and the "
                        "servers, freeze the objects made at start (gc.freeze) and collect the youngest "
                        "generation every N allocations instead of Python's 700: fewer and cheaper collections")
    parser.add_argument("--dir", default=None, help="where the servers' files go (default: a temp dir)")
    parser.add_argument("-o", "--output", choices=["human", "json"], default="human")
    parser.add_argument("--serve", metavar="FILE", help=argparse.SUPPRESS)


def _grpc_options(specs: list[str]) -> list[tuple[str, int | str]]:
    """NAME=VALUE strings as gRPC channel arguments; ValueError names the bad one."""
    options = []
    for spec in specs:
        name, sep, value = spec.partition("=")
        if not sep or not name:
            raise ValueError(f"--grpc-option {spec!r} is not NAME=VALUE")
        options.append((name, int(value) if value.lstrip("-").isdigit() else value))
    return options


def _writer(path: str, fsync: Fsync) -> Callable[[bytes], None]:
    """Append one message to `path` and make it durable the way `fsync` names."""
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_APPEND | (os.O_DSYNC if fsync is Fsync.DSYNC else 0), 0o644)
    if fsync is not Fsync.FDATASYNC:
        return lambda message: os.write(fd, message) and None

    def write(message: bytes) -> None:
        os.write(fd, message)
        os.fdatasync(fd)
    return write


def _handler(append, append_one):
    import grpc
    return grpc.method_handlers_generic_handler("pybk.bench.Floor", {
        "Append": grpc.stream_stream_rpc_method_handler(append),
        "AppendOne": grpc.unary_unary_rpc_method_handler(append_one)})


def _announce(port: int) -> None:
    """Tells the parent the port this server bound: binding port 0 leaves no window for another process."""
    print(port, flush=True)


def _bound_port(proc: subprocess.Popen, timeout: float = 60.0) -> int:
    """The port a server child announced on its first line of output."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline() if ready else ""
    if not line.strip().isdigit():
        raise RuntimeError(f"a bench server did not start within {timeout:.0f} s (exit code {proc.poll()})")
    return int(line)


async def _serve_aio(write: Callable[[bytes], None], options: list, via_context: bool) -> None:
    import grpc

    async def append(requests, context):
        async for message in requests:
            write(message)
            yield message[:8]

    async def append_via_context(requests, context):
        while (message := await context.read()) is not grpc.aio.EOF:
            write(message)
            await context.write(message[:8])

    async def append_one(message, context):
        write(message)
        return message[:8]

    server = grpc.aio.server(options=options)
    server.add_generic_rpc_handlers((_handler(append_via_context if via_context else append, append_one),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    _announce(port)
    await server.wait_for_termination()


async def _serve_ngh2(write: Callable[[bytes], None]) -> None:
    from pybk.transport.ngh2_server import Call, GrpcServerConnection

    class Append:
        def __init__(self, call: Call):
            self.call = call

        def message(self, data: bytes) -> None:
            write(data)
            self.call.send(data[:8])

        def end_of_input(self) -> None:
            self.call.finish()

        def closed(self) -> None:
            pass

    def route(call: Call):
        return Append(call) if call.path == _METHOD else None

    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: GrpcServerConnection(route, 64 * 1024 * 1024), "127.0.0.1", 0)
    _announce(server.sockets[0].getsockname()[1])
    await server.serve_forever()


def _serve_sync(write: Callable[[bytes], None], options: list) -> None:
    from concurrent import futures

    import grpc

    def append(requests, context):
        for message in requests:
            write(message)
            yield message[:8]

    def append_one(message, context):
        write(message)
        return message[:8]

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=options)
    server.add_generic_rpc_handlers((_handler(append, append_one),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    _announce(port)
    server.wait_for_termination()


class _Acks:
    """Counts answers per message; `answer` says when a message has just reached its quorum."""

    def __init__(self, quorum: int, servers: int) -> None:
        self.quorum, self.servers, self.counts = quorum, servers, {}

    def answer(self, seq: int) -> bool:
        self.counts[seq] = n = self.counts.get(seq, 0) + 1
        if n == self.servers:
            del self.counts[seq]
        return n == self.quorum


async def _measure_aio(ports: list[int], entries: int, size: int, quorum: int, mode: Client,
                       options: list, rate: float | None = None) -> tuple[list[float], float]:
    """Latencies (sorted) and the client's CPU seconds. Window 1, or with `rate` messages sent at
    that pace whatever is in flight, each timed from its send to its quorum."""
    import grpc

    from pybk.transport.ngh2_client import ClientStream

    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{p}", options=options) for p in ports]
    for ch in channels:
        await asyncio.wait_for(ch.channel_ready(), 30)
    outboxes: list[asyncio.Queue] = [asyncio.Queue() for _ in ports]

    async def requests(outbox: asyncio.Queue):
        while (message := await outbox.get()) is not None:
            yield message

    if mode is Client.AIO_ITERATOR:
        calls = [ch.stream_stream(_METHOD)(requests(box)) for ch, box in zip(channels, outboxes)]
    elif mode is Client.NGH2:
        calls = []
        streams = [ClientStream.open(f"127.0.0.1:{p}", _METHOD, on_headers=lambda _: None,
                                     on_message=lambda answer: answered(int.from_bytes(answer, "big")),
                                     on_end=lambda code, details: None) for p in ports]
    else:
        calls = [ch.stream_stream(_METHOD)() for ch in channels]
    unaries = [ch.unary_unary(_METHOD_ONE) for ch in channels]
    loop = asyncio.get_running_loop()
    acks = _Acks(quorum, len(ports))  # every mode sends each message to every server
    waiting: dict[int, asyncio.Future] = {}

    def answered(seq: int) -> None:
        if acks.answer(seq):
            waiting.pop(seq).set_result(None)

    async def answers(call) -> None:
        while (answer := await call.read()) is not grpc.aio.EOF:
            answered(int.from_bytes(answer, "big"))

    readers = [loop.create_task(answers(c)) for c in calls]
    payload = b"x" * max(0, size - 8)
    latencies: list[float] = []
    cpu0 = time.process_time()
    start = time.perf_counter()
    for seq in range(entries):  # window 1: the next goes out once this one has a quorum; with a rate, on time
        if rate:
            delay = start + seq / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
        message = seq.to_bytes(8, "big") + payload
        waiting[seq] = done = loop.create_future()
        t0 = time.perf_counter()
        if mode is Client.AIO_UNARY:
            for unary in unaries:
                unary(message).add_done_callback(lambda _, seq=seq: answered(seq))
        elif mode is Client.AIO_ITERATOR:
            for box in outboxes:
                box.put_nowait(message)
        elif mode is Client.NGH2:
            for stream in streams:
                stream.write(message)
        elif mode is Client.AIO_GATHER:
            await asyncio.gather(*(call.write(message) for call in calls))
        else:
            for call in calls:
                await call.write(message)
        if rate:
            done.add_done_callback(lambda _, t0=t0: latencies.append(time.perf_counter() - t0))
        else:
            await done
            latencies.append(time.perf_counter() - t0)
    await asyncio.gather(*waiting.values())   # the messages still short of a quorum (none at window 1)
    client_cpu = time.process_time() - cpu0
    if mode is Client.NGH2:
        for stream in streams:
            stream.cancel()
    for call, box in zip(calls, outboxes):
        if mode is Client.AIO_ITERATOR:
            box.put_nowait(None)
        else:
            await call.done_writing()
    for r in readers:
        r.cancel()
    for ch in channels:
        await ch.close()
    return sorted(latencies), client_cpu


def _measure_sync(ports: list[int], entries: int, size: int, quorum: int, unary: bool,
                  options: list) -> tuple[list[float], float]:
    import grpc

    channels = [grpc.insecure_channel(f"127.0.0.1:{p}", options=options) for p in ports]
    for ch in channels:
        grpc.channel_ready_future(ch).result(timeout=30)
    outboxes: list[queue.SimpleQueue] = [queue.SimpleQueue() for _ in ports]
    calls = [ch.stream_stream(_METHOD)(iter(box.get, None)) for ch, box in zip(channels, outboxes)]
    unaries = [ch.unary_unary(_METHOD_ONE) for ch in channels]
    acks, lock = _Acks(quorum, len(calls)), threading.Lock()
    waiting: dict[int, threading.Event] = {}

    def answered(seq: int) -> None:
        with lock:
            if acks.answer(seq):
                waiting.pop(seq).set()

    def answers(call) -> None:
        for answer in call:
            answered(int.from_bytes(answer, "big"))

    readers = [threading.Thread(target=answers, args=(c,), daemon=True) for c in calls]
    for r in readers:
        r.start()
    payload = b"x" * max(0, size - 8)
    latencies = []
    cpu0 = time.process_time()
    for seq in range(entries):
        message = seq.to_bytes(8, "big") + payload
        with lock:
            waiting[seq] = done = threading.Event()
        t0 = time.perf_counter()
        if unary:
            for one in unaries:
                one.future(message).add_done_callback(lambda _, seq=seq: answered(seq))
        else:
            for box in outboxes:
                box.put(message)
        done.wait()
        latencies.append(time.perf_counter() - t0)
    client_cpu = time.process_time() - cpu0
    for box in outboxes:
        box.put(None)
    for r in readers:
        r.join(30)
    for ch in channels:
        ch.close()
    return sorted(latencies), client_cpu


def _tune_gc(threshold: int | None) -> None:
    """Move what exists now out of the collector's sight and collect less often, when asked."""
    if threshold is not None:
        import gc
        gc.freeze()
        gc.set_threshold(threshold, *gc.get_threshold()[1:])


def _run_loop(loop: Loop, coro):
    """Run `coro` on the named event loop."""
    if loop is Loop.UVLOOP:
        import uvloop
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(coro)
    return asyncio.run(coro)


def run(args: argparse.Namespace) -> int:
    fsync = Fsync.NONE if args.no_fsync else args.fsync
    try:
        options = _grpc_options(args.grpc_option)
    except ValueError as e:
        print(f"pybk bench floor: {e}", file=sys.stderr)
        return 2
    if args.serve:
        import grpc  # noqa: F401 - imported before the gc freeze, like the client's
        _tune_gc(args.gc_threshold)
        write = _writer(args.serve, fsync)
        if args.server is Server.SYNC:
            _serve_sync(write, options)
        elif args.server is Server.NGH2:
            _run_loop(args.loop, _serve_ngh2(write))
        else:
            _run_loop(args.loop, _serve_aio(write, options, args.server is Server.AIO_CONTEXT))
        return 0
    if args.rate is not None and (args.rate <= 0 or args.client in (Client.SYNC, Client.SYNC_UNARY)):
        print("pybk bench floor: --rate must be above 0 and needs an asyncio client (not --client sync or "
              "sync-unary)", file=sys.stderr)
        return 2
    if not 1 <= args.ack_quorum <= args.servers:
        print("pybk bench floor: --ack-quorum must be between 1 and --servers", file=sys.stderr)
        return 2
    server_loop = args.server_loop or args.loop
    variant = ["--server", args.server, "--loop", server_loop, "--fsync", fsync]
    variant += [f"--grpc-option={spec}" for spec in args.grpc_option]
    variant += [] if args.gc_threshold is None else ["--gc-threshold", str(args.gc_threshold)]
    import grpc  # noqa: F401 - imported before the gc freeze
    with tempfile.TemporaryDirectory(prefix="pybk-floor-", dir=args.dir) as tmp:
        procs = [subprocess.Popen([sys.executable, "-m", "pybk.cli", "bench", "floor", "--serve",
                                   os.path.join(tmp, f"server-{i}.log")] + variant, stdout=subprocess.PIPE, text=True)
                 for i in range(args.servers)]
        try:
            ports = [_bound_port(p) for p in procs]
            _tune_gc(args.gc_threshold)
            cpu_before = cpu_seconds([p.pid for p in procs])
            if args.client in (Client.SYNC, Client.SYNC_UNARY):
                lat, client_cpu = _measure_sync(ports, args.entries, args.size, args.ack_quorum,
                                                args.client is Client.SYNC_UNARY, options)
            else:
                lat, client_cpu = _run_loop(args.loop, _measure_aio(
                    ports, args.entries, args.size, args.ack_quorum, args.client, options, args.rate))
            server_cpu = cpu_seconds([p.pid for p in procs]) - cpu_before
        except grpc.RpcError as exc:
            code = exc.code() if callable(getattr(exc, "code", None)) else None
            print(f"pybk bench floor: a server answered {code.name if code else exc}", file=sys.stderr)
            return 1
        except RuntimeError as exc:
            print(f"pybk bench floor: {exc}", file=sys.stderr)
            return 1
        finally:
            for p in procs:
                p.kill()
                p.wait()
    result = {"servers": args.servers, "ack_quorum": args.ack_quorum, "entries": args.entries, "size": args.size,
              "client": args.client, "server": args.server, "loop": args.loop, "server_loop": server_loop,
              "fsync": fsync, "grpc_options": dict(options), "gc_threshold": args.gc_threshold, "rate": args.rate,
              "answered": len(lat), "p50_ms": percentile(lat, 0.5) * 1e3, "p99_ms": percentile(lat, 0.99) * 1e3,
              "p999_ms": percentile(lat, 0.999) * 1e3,
              "client_cpu_us": client_cpu / args.entries * 1e6, "servers_cpu_us": server_cpu / args.entries * 1e6}
    if args.output == "json":
        print(json.dumps(result))
    else:
        pace = f"{args.rate:g} messages/s" if args.rate else "window 1"
        print(f"bare gRPC, client {args.client} on {args.loop}, {args.servers} servers {args.server} on "
              f"{server_loop}, ack quorum {args.ack_quorum}, {pace}, {args.size} B, durability {fsync}: latency p50 "
              f"{result['p50_ms']:.2f} ms, p99 {result['p99_ms']:.2f} ms, p999 {result['p999_ms']:.2f} ms; CPU per "
              f"message: client "
              f"{result['client_cpu_us']:.1f} us, servers {result['servers_cpu_us']:.1f} us")
        print("command: pybk bench floor " + " ".join(sys.argv[sys.argv.index("floor") + 1:]))
    return 0
