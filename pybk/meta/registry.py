"""The bookie registry: who is up, writable or read-only, on the session lease.

Keys `/<prefix>/bookies/writable/<id>` and `/<prefix>/bookies/readonly/<id>` hold a BookieInfo as
JSON, attached to the registering process's lease: a crashed bookie disappears when its lease
expires, a clean shutdown removes it at once. After a lost lease the session re-registers every
bookie this process registered.
"""
from __future__ import annotations

import asyncio
import enum
import json
import logging
from dataclasses import asdict, dataclass
from .errors import BadMetadataError, BookieIdInUseError, WatchCompactedError
from .etcd import Etcd, cmp_create, cmp_lease, op_delete, op_put, prefix_end
from .session import Session
from .watch import DELETE, Watch

log = logging.getLogger(__name__)

class RegistryState(enum.StrEnum):
    """Where a bookie stands in the registry; WRITABLE and READONLY are also its key directory."""
    WRITABLE = "writable"
    READONLY = "readonly"
    GONE = "gone"


WRITABLE, READONLY, GONE = RegistryState.WRITABLE, RegistryState.READONLY, RegistryState.GONE


def registry_state(readonly: bool) -> RegistryState:
    """The state (and key directory) of a registration made with this readonly flag."""
    return READONLY if readonly else WRITABLE


@dataclass(frozen=True)
class BookieInfo:
    """How to reach a bookie and where it stands (zone/rack for placement)."""

    bookie_id: str
    grpc: str
    http: str = ""
    zone: str = ""
    rack: str = ""
    version: str = ""

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> "BookieInfo":
        try:
            d = json.loads(data)
            return cls(**{k: str(d.get(k, "")) for k in ("bookie_id", "grpc", "http", "zone", "rack", "version")})
        except (ValueError, TypeError) as exc:
            raise BadMetadataError(f"undecodable bookie registration {data[:80]!r}: {exc}") from None


@dataclass(frozen=True)
class BookieEvent:
    """A bookie's registration changed: state is writable, readonly or gone (info None when gone)."""

    bookie_id: str
    state: RegistryState
    info: BookieInfo | None
    revision: int


def check_bookie_id(bookie_id: str) -> str:
    if not bookie_id or "/" in bookie_id or not bookie_id.isprintable() or " " in bookie_id:
        raise BadMetadataError(f"bad bookie id {bookie_id!r}: must be non-empty, printable, "
                               "without spaces or '/'")
    return bookie_id


class Registry:
    """`store.registry`: register/unregister this process's bookies; list and watch all."""

    def __init__(self, etcd: Etcd, prefix: bytes, session: Session):
        self.etcd = etcd
        self.session = session
        self.dir = prefix + b"bookies/"
        self._mine: dict[str, tuple[BookieInfo, bool]] = {}
        self._lock = asyncio.Lock()
        session.on_new_lease(self._reregister)

    def key(self, state: RegistryState, bookie_id: str) -> bytes:
        """The etcd key of bookie_id's registration in state (writable|readonly)."""
        return self.dir + state.encode() + b"/" + check_bookie_id(bookie_id).encode()

    async def register(self, info: BookieInfo, readonly: bool = False, wait: float | None = None) -> None:
        """Register info as writable (or read-only) on the session lease.

        If another process's registration of the same id is still live (e.g. a killed
        predecessor whose lease has not expired yet) wait up to `wait` seconds (default: the
        lease TTL plus 5 s) for it to expire, then raise BookieIdInUseError.
        """
        async with self._lock:
            self._mine[info.bookie_id] = (info, readonly)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + (self.session.ttl + 5 if wait is None else wait)
            while True:
                holder = await self._put(info, readonly)
                if holder is None:
                    return
                if loop.time() >= deadline:
                    self._mine.pop(info.bookie_id, None)
                    raise BookieIdInUseError(
                        f"bookie id {info.bookie_id!r} is registered by another live process (lease "
                        f"{holder:x}); stop that bookie or wait for its lease to expire")
                await asyncio.sleep(0.5)

    async def _put(self, info: BookieInfo, readonly: bool) -> int | None:
        """Write the registration; None on success, else the lease of the foreign live holder."""
        keys = [self.key(registry_state(ro), info.bookie_id) for ro in (readonly, not readonly)]
        while True:
            lease = await self.session.lease_id()
            # Two plain reads, not a read-only txn (see Etcd.txn); the guarded write below
            # catches any change between them.
            found = [[kv] if (kv := await self.etcd.get(key)) else [] for key in keys]
            holders = {kv.lease for kvs in found for kv in kvs} - {lease}
            if holders:
                return holders.pop()
            # Each key must still be absent or on our lease when we write.
            guards = [cmp_lease(key, lease) if kvs else cmp_create(key, 0) for key, kvs in zip(keys, found)]
            resp = await self.etcd.txn(guards, [op_put(keys[0], info.to_bytes(), lease), op_delete(keys[1])],
                                       what=f"register bookie {info.bookie_id}")
            if resp.succeeded:
                return None

    async def set_readonly(self, bookie_id: str, readonly: bool = True) -> None:
        """Move this process's registration of bookie_id to read-only (or back to writable)."""
        async with self._lock:
            if bookie_id not in self._mine:
                raise BadMetadataError(f"bookie {bookie_id!r} is not registered by this process")
            info, _ = self._mine[bookie_id]
            self._mine[bookie_id] = (info, readonly)
            holder = await self._put(info, readonly)
            if holder is not None:
                raise BookieIdInUseError(f"bookie id {bookie_id!r} is registered by another live process")

    async def unregister(self, bookie_id: str) -> None:
        """Remove the bookie's registration now (clean shutdown)."""
        async with self._lock:
            self._mine.pop(bookie_id, None)
            lease = self.session.current
            for state in (WRITABLE, READONLY):
                key = self.key(state, bookie_id)
                if lease is None:
                    continue
                await self.etcd.txn([cmp_lease(key, lease)], [op_delete(key)], what=f"unregister {bookie_id}")

    async def _reregister(self, lease: int) -> None:
        async with self._lock:
            for info, readonly in list(self._mine.values()):
                holder = await self._put(info, readonly)
                if holder is not None:
                    log.error("cannot re-register bookie %s: id held by lease %x", info.bookie_id, holder)
                else:
                    log.warning("re-registered bookie %s (%s) on new lease %x", info.bookie_id,
                                registry_state(readonly), lease)

    async def _list(self, state: RegistryState) -> dict[str, BookieInfo]:
        start = self.dir + state.encode() + b"/"
        resp = await self.etcd.range(start, prefix_end(start))
        return {kv.key[len(start):].decode(): BookieInfo.from_bytes(kv.value) for kv in resp.kvs}

    async def writable(self) -> dict[str, BookieInfo]:
        """Writable bookies by id."""
        return await self._list(WRITABLE)

    async def readonly(self) -> dict[str, BookieInfo]:
        """Read-only bookies by id."""
        return await self._list(READONLY)

    async def all(self) -> dict[str, tuple[RegistryState, BookieInfo]]:
        """Every registered bookie: id -> (writable|readonly, info)."""
        resp = await self.etcd.range(self.dir, prefix_end(self.dir))
        return _states(self.dir, resp.kvs)

    async def get(self, bookie_id: str) -> tuple[RegistryState, BookieInfo | None]:
        """(writable|readonly|gone, info) of one bookie."""
        start = self.dir
        resp = await self.etcd.range(start, prefix_end(start))
        found = _states(self.dir, resp.kvs).get(bookie_id)
        return found if found else (GONE, None)

    def watch(self, initial: bool = True) -> "RegistryWatch":
        """Joins, departures and read-only switches as BookieEvents; with initial, first one event
        per currently registered bookie."""
        return RegistryWatch(self, initial)


def _states(dir_: bytes, kvs) -> dict[str, tuple[RegistryState, BookieInfo]]:
    """id -> (state, info) from registry keys; a bookie in both states counts as read-only."""
    out: dict[str, tuple[RegistryState, BookieInfo]] = {}
    for kv in kvs:
        directory, _, bid = kv.key[len(dir_):].decode().partition("/")
        if directory not in (WRITABLE, READONLY) or not bid:
            continue
        state = RegistryState(directory)
        if state is READONLY or bid not in out:
            out[bid] = (state, BookieInfo.from_bytes(kv.value))
    return out


class RegistryWatch:
    """Async iterator of BookieEvents, resuming across etcd disconnects and restarts."""

    def __init__(self, registry: Registry, initial: bool):
        self.registry = registry
        self.initial = initial
        self._present: dict[RegistryState, dict[str, BookieInfo]] = {WRITABLE: {}, READONLY: {}}
        self._watch: Watch | None = None
        self._pending: list[BookieEvent] = []

    def __aiter__(self) -> "RegistryWatch":
        return self

    async def __aenter__(self) -> "RegistryWatch":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        if self._watch is not None:
            await self._watch.close()

    def _state(self, bid: str) -> tuple[RegistryState, BookieInfo | None]:
        if bid in self._present[READONLY]:
            return READONLY, self._present[READONLY][bid]
        if bid in self._present[WRITABLE]:
            return WRITABLE, self._present[WRITABLE][bid]
        return GONE, None

    async def _start(self) -> None:
        """Read the registry at one revision, queue the differences to what was known, and
        watch from the next revision (also how the watch recovers if etcd compacted the history
        it needed to resume)."""
        d = self.registry.dir
        resp = await self.registry.etcd.range(d, prefix_end(d))
        known = {bid: self._state(bid) for bid in set(self._present[WRITABLE]) | set(self._present[READONLY])}
        self._present = {WRITABLE: {}, READONLY: {}}
        for kv in resp.kvs:
            state, _, bid = kv.key[len(d):].decode().partition("/")
            if state in self._present and bid:
                self._present[state][bid] = BookieInfo.from_bytes(kv.value)
        now = set(self._present[WRITABLE]) | set(self._present[READONLY])
        first = self._watch is None
        for bid in sorted(now | set(known)):
            state, info = self._state(bid)
            if (first and self.initial) or (not first and known.get(bid, (GONE, None)) != (state, info)):
                self._pending.append(BookieEvent(bid, state, info, resp.header.revision))
        if self._watch is not None:
            await self._watch.close()
        self._watch = Watch(self.registry.etcd, d, prefix_end(d), start_revision=resp.header.revision + 1)

    async def __anext__(self) -> BookieEvent:
        if self._watch is None:
            await self._start()
        while not self._pending:
            try:
                ev = await self._watch.__anext__()
            except WatchCompactedError:
                await self._start()
                continue
            state, _, bid = ev.key[len(self.registry.dir):].decode().partition("/")
            if state not in self._present or not bid:
                continue
            before = self._state(bid)
            if ev.type == DELETE:
                self._present[state].pop(bid, None)
            else:
                self._present[state][bid] = BookieInfo.from_bytes(ev.value)
            after = self._state(bid)
            if after != before:
                self._pending.append(BookieEvent(bid, after[0], after[1], ev.revision))
        return self._pending.pop(0)
