"""The etcd I/O of named logs: reads, and the transactions that apply layout's transitions.
Every structural change is one transaction guarded by a compare on the values it was decided from."""
from __future__ import annotations

from typing import AsyncIterator

from aetcd import rpc

from pybk.meta import MetadataStore
from pybk.meta.etcd import cmp_create, cmp_mod, op_delete, op_get, op_put, prefix_end

from .errors import LogExistsError, LogNotFoundError
from .layout import Cursor, Head, Keys, LogState, Segment, config_bytes, config_from_bytes
from .options import LogConfig


class LogMeta:
    """The log keys of one metadata store (`pybk.log.layout` describes them)."""

    def __init__(self, store: MetadataStore):
        self.store = store
        self.etcd = store.etcd
        self.keys = Keys(store.prefix)

    # ---- names and config ---------------------------------------------------------------

    async def create(self, name: str, config: LogConfig, password_hash: bytes) -> int:
        """Create the log `name` with a new id, its config and an empty head in one transaction;
        LogExistsError if the name is taken."""
        log_id = await self.store.ledgers.allocate_id()
        k = self.keys
        cfg = config_bytes(name, config, password_hash)
        resp = await self.etcd.txn([cmp_create(k.name(name), 0)],
                                   [op_put(k.name(name), b"%d" % log_id), op_put(k.config(log_id), cfg),
                                    op_put(k.head(log_id), Head().to_bytes())],
                                   what=f"create log {name}")
        if not resp.succeeded:
            raise LogExistsError(name)
        return log_id

    async def resolve(self, name: str) -> int:
        """The id of the log called `name`; LogNotFoundError if there is none."""
        kv = await self.etcd.get(self.keys.name(name))
        if kv is None:
            raise LogNotFoundError(name)
        return int(kv.value)

    async def names(self) -> AsyncIterator[tuple[str, int]]:
        """(name, log id) of every log, in name order, a page at a time."""
        start, end = self.keys.names, prefix_end(self.keys.names)
        while True:
            resp = await self.etcd.range(start, end, limit=500)
            for kv in resp.kvs:
                yield kv.key[len(self.keys.names):].decode(), int(kv.value)
            if not resp.more:
                return
            start = resp.kvs[-1].key + b"\0"

    async def config(self, log_id: int) -> tuple[LogConfig, bytes]:
        """The log's configuration and its password's check hash."""
        kv = await self.etcd.get(self.keys.config(log_id))
        if kv is None:
            raise LogNotFoundError(f"#{log_id}")
        return config_from_bytes(kv.value)

    async def replace_config(self, name: str, log_id: int, config: LogConfig, password_hash: bytes) -> bool:
        """Store a new configuration for the log, if `name` still names `log_id` (not deleted or
        re-created meanwhile); False if it does not."""
        k = self.keys
        resp = await self.etcd.txn(
            [rpc.Compare(key=k.name(name), target=rpc.Compare.VALUE, result=rpc.Compare.EQUAL, value=b"%d" % log_id)],
            [op_put(k.config(log_id), config_bytes(name, config, password_hash))], what=f"reconfigure log {name}")
        return resp.succeeded

    # ---- head ---------------------------------------------------------------------------

    async def head(self, log_id: int) -> Head | None:
        kv = await self.etcd.get(self.keys.head(log_id))
        return None if kv is None else Head.from_bytes(kv.value, kv.mod_revision)

    async def put_head(self, log_id: int, head: Head, *, lease: int = 0, writer: str = ""
                       ) -> tuple[bool, Head | None, int]:
        """CAS the head (and, with `writer`, put the writer key on `lease`). Returns (succeeded,
        the stored head as it is now if the CAS lost (None: the log is gone), revision)."""
        k = self.keys
        ops = [op_put(k.head(log_id), head.to_bytes())]
        if writer:
            ops.append(op_put(k.writer(log_id), writer.encode(), lease))
        resp = await self.etcd.txn([cmp_mod(k.head(log_id), head.version)], ops, [op_get(k.head(log_id))],
                                   what=f"update head of log {log_id}")
        if resp.succeeded:
            return True, None, resp.header.revision
        kvs = resp.responses[0].response_range.kvs
        return False, (Head.from_bytes(kvs[0].value, kvs[0].mod_revision) if kvs else None), resp.header.revision

    async def commit(self, log_id: int, head: Head, new_head: Head | None, put: list[Segment],
                     delete: list[Segment] = ()) -> tuple[bool, Head | None, int]:
        """One structural change: if the head is still at head.version, store `new_head` (None: keep
        it) and the segments in `put` (each compared to its version, 0: must not exist) and delete
        those in `delete`. Returns (succeeded, head now if it lost, revision)."""
        k = self.keys
        cmps = [cmp_mod(k.head(log_id), head.version)]
        ops = []
        if new_head is not None:
            ops.append(op_put(k.head(log_id), new_head.to_bytes()))
        for s in put:
            key = k.segment(log_id, s.seq)
            cmps.append(cmp_mod(key, s.version) if s.version else cmp_create(key, 0))
            ops.append(op_put(key, s.to_bytes()))
        for s in delete:
            key = k.segment(log_id, s.seq)
            cmps.append(cmp_mod(key, s.version))
            ops.append(op_delete(key))
        resp = await self.etcd.txn(cmps, ops, [op_get(k.head(log_id))], what=f"change segments of log {log_id}")
        if resp.succeeded:
            return True, None, resp.header.revision
        kvs = resp.responses[0].response_range.kvs
        return False, (Head.from_bytes(kvs[0].value, kvs[0].mod_revision) if kvs else None), resp.header.revision

    async def renew_writer(self, log_id: int, epoch: int, writer: str, lease: int) -> bool:
        """Put the writer key again on a new session lease, if the head still names `epoch`."""
        while True:
            head = await self.head(log_id)
            if head is None or head.epoch != epoch or head.state is not LogState.ACTIVE:
                return False
            resp = await self.etcd.txn([cmp_mod(self.keys.head(log_id), head.version)],
                                       [op_put(self.keys.writer(log_id), writer.encode(), lease)],
                                       what=f"renew writer of log {log_id}")
            if resp.succeeded:
                return True

    async def writer_key(self, log_id: int):
        """The live writer key (its KeyValue: value = writer name, lease) or None."""
        return await self.etcd.get(self.keys.writer(log_id))

    async def release_writer(self, log_id: int, lease: int) -> None:
        """Delete the writer key if it is still this lease's."""
        k = self.keys.writer(log_id)
        await self.etcd.txn([rpc.Compare(key=k, target=rpc.Compare.LEASE, result=rpc.Compare.EQUAL, lease=lease)],
                            [op_delete(k)], what=f"release writer of log {log_id}")

    # ---- segments -----------------------------------------------------------------------

    async def segment(self, log_id: int, seq: int) -> Segment | None:
        kv = await self.etcd.get(self.keys.segment(log_id, seq))
        return None if kv is None else Segment.from_bytes(kv.value, kv.mod_revision)

    async def segment_at_or_after(self, log_id: int, seq: int) -> Segment | None:
        """The first stored segment whose sequence is >= seq. Sequence numbers are dense from the
        first stored segment to the last (truncation deletes a prefix), so that is segment `seq`
        itself, one key read, unless `seq` is below the first or past the last: then one range
        read (etcd counts the keys of a range, so a range over a long log costs its length)."""
        found = await self.segment(log_id, max(seq, 0))
        if found is not None:
            return found
        k = self.keys
        resp = await self.etcd.range(k.segment(log_id, max(seq, 0)), prefix_end(k.segments(log_id)), limit=1)
        return Segment.from_bytes(resp.kvs[0].value, resp.kvs[0].mod_revision) if resp.kvs else None

    async def last_segment(self, log_id: int) -> Segment | None:
        """The newest segment: the one the head names (two key reads, whatever the log's length;
        a range sorted descending would make etcd read every segment key). None if there is none."""
        head = await self.head(log_id)
        if head is None or head.last_seq < 0:
            return None
        return await self.segment(log_id, head.last_seq)

    async def segments(self, log_id: int, from_seq: int = 0, page: int = 500) -> AsyncIterator[list[Segment]]:
        """Stored segments from `from_seq` on, in order, one page (one range read) at a time."""
        k = self.keys
        start, end = k.segment(log_id, max(from_seq, 0)), prefix_end(k.segments(log_id))
        while True:
            resp = await self.etcd.range(start, end, limit=page)
            if resp.kvs:
                yield [Segment.from_bytes(kv.value, kv.mod_revision) for kv in resp.kvs]
            if not resp.more:
                return
            start = resp.kvs[-1].key + b"\0"

    async def segment_revision(self, log_id: int) -> int:
        """The store's revision now (a watch of the segments from there on misses nothing after)."""
        resp = await self.etcd.range(self.keys.head(log_id), b"", count_only=True)
        return resp.header.revision

    # ---- cursors ------------------------------------------------------------------------

    async def cursor(self, log_id: int, name: str) -> Cursor | None:
        kv = await self.etcd.get(self.keys.cursor(log_id, name))
        return None if kv is None else Cursor.from_bytes(name, kv.value, kv.mod_revision)

    async def put_cursor(self, log_id: int, cursor: Cursor) -> Cursor | None:
        """CAS the cursor on its version (0: must not exist); None if stored, else the cursor now."""
        key = self.keys.cursor(log_id, cursor.name)
        guard = cmp_mod(key, cursor.version) if cursor.version else cmp_create(key, 0)
        resp = await self.etcd.txn([guard, rpc.Compare(key=self.keys.head(log_id), target=rpc.Compare.CREATE,
                                                       result=rpc.Compare.GREATER, create_revision=0)],
                                   [op_put(key, cursor.to_bytes())], [op_get(key)],
                                   what=f"commit cursor {cursor.name} of log {log_id}")
        if resp.succeeded:
            return None
        kvs = resp.responses[0].response_range.kvs
        if not kvs:
            raise LogNotFoundError(f"#{log_id}")
        return Cursor.from_bytes(cursor.name, kvs[0].value, kvs[0].mod_revision)

    async def cursors(self, log_id: int) -> list[Cursor]:
        k = self.keys.cursors(log_id)
        resp = await self.etcd.range(k, prefix_end(k))
        return [Cursor.from_bytes(kv.key[len(k):].decode(), kv.value, kv.mod_revision) for kv in resp.kvs]

    async def delete_cursor(self, log_id: int, name: str) -> bool:
        resp = await self.etcd.delete(self.keys.cursor(log_id, name))
        return resp.deleted > 0

    # ---- deletion -----------------------------------------------------------------------

    async def unname(self, name: str, log_id: int, head: Head, deleting: Head) -> bool:
        """Free the name and mark the log DELETING, if no writer is live and the head is unchanged."""
        k = self.keys
        resp = await self.etcd.txn(
            [rpc.Compare(key=k.name(name), target=rpc.Compare.VALUE, result=rpc.Compare.EQUAL, value=b"%d" % log_id),
             cmp_mod(k.head(log_id), head.version), cmp_create(k.writer(log_id), 0)],
            [op_delete(k.name(name)), op_put(k.head(log_id), deleting.to_bytes())], what=f"delete log {name}")
        return resp.succeeded

    async def drop(self, log_id: int) -> None:
        """Delete every key of the log (its name is gone already)."""
        k = self.keys.log(log_id)
        await self.etcd.delete(k, prefix_end(k))

    async def delete_segments(self, log_id: int, segments: list[Segment]) -> None:
        """Delete segment keys (each only if unchanged since read)."""
        for i in range(0, len(segments), 100):
            batch = segments[i:i + 100]
            await self.etcd.txn([], [op_delete(self.keys.segment(log_id, s.seq)) for s in batch],
                                what=f"delete truncated segments of log {log_id}")
