"""How the `pybk` data source runs asyncio code from Spark's synchronous calls.

Spark calls planning, read() and write() synchronously in its Python workers; the asyncio client
runs on one event loop per Python worker process (`event_loop`), with one shared client per
metadata URI and credentials (`client`).
"""
from __future__ import annotations

import asyncio
import gc
import logging
import sys
from dataclasses import replace
from typing import Any, AsyncIterator, Callable, Iterator, TypeVar

from pybk import eventloop
from pybk.local.client import local_client_for, overlay
from pybk.security.settings import ClientSecurity

from .options import OptionError, ReadOptions, WriteOptions

CONNECT_TIMEOUT = 20.0
_log = logging.getLogger("pybk.spark")

_LOOP: asyncio.AbstractEventLoop | None = None
_CLIENTS: dict[tuple[str, ClientSecurity | None], Any] = {}
_FROZEN = False


def event_loop() -> asyncio.AbstractEventLoop:
    """This process's event loop, created once and never closed.

    grpc.aio binds its completion queue to the first loop that uses it, and Spark reuses Python
    workers for many tasks: a fresh loop per task would leave gRPC posting to a closed loop. One
    loop per process also lets every task share one client (one etcd and one bookie connection
    each) instead of connecting per partition.
    """
    global _LOOP
    if _LOOP is None or _LOOP.is_closed():
        _LOOP = eventloop.new_loop()
    asyncio.set_event_loop(_LOOP)
    return _LOOP


def run(coro) -> Any:
    """Run one coroutine to completion on this process's loop (Spark calls us synchronously)."""
    return event_loop().run_until_complete(coro)


def freeze_once() -> None:
    """Once per process: collect garbage, then move every object alive into the collector's
    permanent generation (gc.freeze).

    Spark's reused Python worker runs a full gc.collect() after every task (pyspark.daemon), which
    walks every object of the process: with pyarrow, numpy, grpc and the client loaded, about
    50 ms of CPU per partition, most of a small partition's read. Frozen objects are skipped by
    that walk; they are still freed when their last reference goes, only cycles among them are
    never collected, and they are what the process held once, after its first partition started:
    a bounded set."""
    global _FROZEN
    if not _FROZEN:
        _FROZEN = True
        gc.collect()
        gc.freeze()


def drive(make: Callable[[], AsyncIterator[Any]]) -> Iterator[Any]:
    """Iterate an async generator from synchronous code on this process's loop (an executor's
    read: once its first item is ready, the process's objects are frozen, `freeze_once`).

    Spark pulls Arrow batches one by one; each pull runs the loop until the next batch is ready.
    Stopping early (a LIMIT) closes the generator on the same loop.
    """
    loop = event_loop()
    agen = make()
    try:
        while True:
            try:
                item = loop.run_until_complete(agen.__anext__())
                freeze_once()
            except StopAsyncIteration:
                return
            yield item
    finally:
        loop.run_until_complete(agen.aclose())


async def connect(uri: str, security: ClientSecurity | None = None):
    """A new BookKeeper client for uri with these credentials (None: this process's credential
    variables, `PYBK_TLS_CA`, `PYBK_TOKEN_FILE`, ...), or an OptionError that names the
    unreachable service, or NoClusterError when no cluster lives under the URI's prefix."""
    from pybk.client import BookKeeper
    from pybk.meta.errors import BadMetadataUriError, MetadataUnavailableError
    try:
        bk = await asyncio.wait_for(BookKeeper.connect(uri, security=security), CONNECT_TIMEOUT)
    except (asyncio.TimeoutError, OSError) as exc:
        raise OptionError(f"metadata service {uri} is unreachable: {exc or 'timed out'}") from exc
    except (MetadataUnavailableError, BadMetadataUriError) as exc:
        raise OptionError(f"metadata service {uri}: {exc}") from exc
    try:
        await bk.store.cluster.require()  # a wrong prefix is an error, not an empty cluster
    except BaseException:
        await bk.close()
        raise
    return bk


async def client(uri: str, security: ClientSecurity | None = None):
    """This process's shared client for uri and credentials (kept open for the worker's later tasks)."""
    bk = _CLIENTS.get((uri, security))
    if bk is None:
        bk = _CLIENTS[(uri, security)] = await connect(uri, security)
    return bk


Options = TypeVar("Options", ReadOptions, WriteOptions)


def with_credentials(opts: Options) -> Options:
    """opts with the credentials resolved on the driver, so that every executor presents the same
    files: the ones given as options, else the local cluster's (its local.json, when the URI names
    the cluster of $PYBK_LOCAL_DIR or ./.pybk-local) overridden by the driver's credential
    variables (`PYBK_TLS_CA`, `PYBK_TOKEN_FILE`, ...); else none (executors then use their own
    environment's)."""
    if opts.security is not None:
        return opts
    local = local_client_for(opts.metadata_uri)
    if local is None or not local.security.as_mapping():
        return opts
    return replace(opts, security=overlay(local.security))


def is_no_such_ledger(exc: BaseException) -> bool:
    """The ledger does not exist: the client's error, or the metadata store's that it wraps.
    Imported here, like the client in `connect`, so importing this module stays light."""
    from pybk.client.errors import NoSuchLedgerError
    from pybk.meta.errors import NoSuchLedgerError as MetaNoSuchLedgerError
    return isinstance(exc, (NoSuchLedgerError, MetaNoSuchLedgerError))


def announce(message: str) -> None:
    """Say something the user must see (a job id to find the job by): on stderr of the driver's
    Python worker, which Spark shows, and in the log at INFO."""
    _log.info("%s", message)
    print(message, file=sys.stderr, flush=True)
