"""Which asyncio event loop a pybk process runs on: the one place loops are made.

Every process (bookie, autorecovery, the blocking client, Spark's Python workers, the
benchmarks) is one asyncio program whose CPU per gRPC message sets its latency and throughput.
uvloop (libuv) runs the same program with less CPU per loop iteration; grpc.aio works on it.
It is optional: `pip install 'pybk[uvloop]'`. `auto` takes uvloop when it is installed and the
standard loop otherwise; asking for `uvloop` without it installed is refused with that cause.
Servers take the choice from their `event_loop` option; clients (the blocking client, Spark,
benchmarks) from the same variable, `PYBK_EVENT_LOOP`, when they are given none.
"""
from __future__ import annotations

import asyncio
import enum
import os
from typing import Any, Callable, Coroutine, TypeVar

T = TypeVar("T")


class EventLoop(enum.StrEnum):
    """The event loop a process asks for."""
    AUTO = "auto"
    ASYNCIO = "asyncio"
    UVLOOP = "uvloop"


class EventLoopError(RuntimeError):
    """The event loop asked for cannot be made here."""


def parse_event_loop(text: str | EventLoop) -> EventLoop:
    """'auto', 'asyncio' or 'uvloop' (any case) -> EventLoop."""
    try:
        return EventLoop(str(text).strip().lower())
    except ValueError:
        raise ValueError(f"not an event loop: {text!r} (use {', '.join(e.value for e in EventLoop)})") from None


ENV = "PYBK_EVENT_LOOP"


def from_env() -> EventLoop:
    """The choice `PYBK_EVENT_LOOP` names (AUTO when unset)."""
    return parse_event_loop(os.environ.get(ENV) or EventLoop.AUTO)


def uvloop_installed() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def resolve(choice: EventLoop | str | None, installed: bool | None = None) -> EventLoop:
    """The loop a choice means on this machine: AUTO is uvloop when installed, else asyncio;
    None is the choice of `PYBK_EVENT_LOOP`."""
    choice = from_env() if choice is None else parse_event_loop(choice)
    have = uvloop_installed() if installed is None else installed
    if choice is EventLoop.AUTO:
        return EventLoop.UVLOOP if have else EventLoop.ASYNCIO
    if choice is EventLoop.UVLOOP and not have:
        raise EventLoopError("event loop uvloop is not installed (pip install 'pybk[uvloop]', "
                             "or use --event-loop asyncio)")
    return choice


def loop_factory(choice: EventLoop | str | None = None) -> Callable[[], asyncio.AbstractEventLoop]:
    """A function that makes a new loop of the chosen kind."""
    if resolve(choice) is EventLoop.UVLOOP:
        import uvloop
        return uvloop.new_event_loop
    return asyncio.new_event_loop


def new_loop(choice: EventLoop | str | None = None) -> asyncio.AbstractEventLoop:
    """A new loop of the chosen kind (for code that owns a long-lived loop)."""
    return loop_factory(choice)()


def run(coro: Coroutine[Any, Any, T], choice: EventLoop | str | None = None) -> T:
    """`asyncio.run` on the chosen kind of loop."""
    factory = loop_factory(choice)
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)


def running() -> EventLoop:
    """The kind of loop running in this thread (ASYNCIO or UVLOOP)."""
    loop = asyncio.get_running_loop()
    return EventLoop.UVLOOP if type(loop).__module__.startswith("uvloop") else EventLoop.ASYNCIO
