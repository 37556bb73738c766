"""`Logs`: named logs on a BookKeeper client: create, open a writer or a reader, describe, commit
cursors, truncate, delete, reclaim orphans, enforce retention.

    async with await BookKeeper.connect(uri) as bk:
        logs = Logs(bk)
        await logs.create("orders", password=b"secret")
        async with await logs.open_writer("orders", password=b"secret") as w:
            offset = await w.append(b"order 1", key=b"customer-7")
        async with await logs.open_reader("orders", start="earliest", end="latest") as r:
            async for rec in r: ...
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Literal

from pybk.client.bookkeeper import BookKeeper, public_key_refusal
from pybk.client.errors import InsecureLedgerError, NoSuchLedgerError, UnauthorizedError
from pybk.entry import DigestType, password_hash
from pybk.security.roles import Operation, allowed

from . import failpoints
from .errors import CursorError, InvalidLogConfigError, LogInUseError, LogNotFoundError, LogTruncatedError
from .layout import Cursor, Head, LogState, Segment, SegmentState, ledger_owner, orphan_reason, truncation_prefix
from .meta import LogMeta
from .options import LogConfig, WriterOptions, check_name
from .reader import LogReader, end_offset, offset_at_time
from .retention import retention_before
from .writer import LogWriter, open_writer

Start = int | Literal["earliest", "latest"]


@dataclass(frozen=True)
class LogRef:
    """A log as resolved from its name: id, configuration and its password's check hash."""

    name: str
    log_id: int
    config: LogConfig
    password_hash: bytes


@dataclass(frozen=True)
class CursorInfo:
    name: str
    offset: int
    lag: int            # records between the cursor and the end of the log


@dataclass
class LogDescription:
    """What `describe` shows: the head, segments, offsets, writer and cursors."""

    name: str
    log_id: int
    config: LogConfig
    epoch: int
    writer: str | None          # the live writer's name (None: no writer has the log open)
    start_offset: int
    end_offset: int
    segments: list[Segment] = field(default_factory=list)
    cursors: list[CursorInfo] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.segments if s.state is SegmentState.CLOSED)


class Logs:
    """Named logs on one BookKeeper client (its metadata store and bookie connections)."""

    def __init__(self, bk: BookKeeper):
        self.bk = bk
        self.meta = LogMeta(bk.store)

    # ---- names --------------------------------------------------------------------------

    async def create(self, name: str, config: LogConfig | None = None, *, password: bytes | None = None) -> LogRef:
        """Create the log `name` (LogExistsError if the name is taken). The password guards writes,
        truncation and deletion, as a ledger's does; with security on one is required."""
        check_name(name)
        config = (config or LogConfig()).validate()
        refusal = public_key_refusal(password, self.bk.security)
        if refusal:
            raise InsecureLedgerError(f"refusing to create log {name!r} without a password: its segment ledgers "
                                      f"would have the empty password's master key ({refusal})")
        pwh = password_hash(password or b"")
        log_id = await self.meta.create(name, config, pwh)
        return LogRef(name, log_id, config, pwh)

    async def ref(self, name: str) -> LogRef:
        """Resolve `name`; LogNotFoundError if there is no such log."""
        check_name(name)
        log_id = await self.meta.resolve(name)
        try:
            config, pwh = await self.meta.config(log_id)
        except LogNotFoundError:
            raise LogNotFoundError(name) from None
        return LogRef(name, log_id, config, pwh)

    async def list(self) -> list[str]:
        """Every log's name, in order."""
        return [n async for n, _ in self.meta.names()]

    def _check_password(self, ref: LogRef, password: bytes | None, what: str) -> bytes:
        if password is None or password_hash(password) != ref.password_hash:
            raise UnauthorizedError(f"{what} log {ref.name!r} needs its password"
                                    + (": the one given is wrong" if password is not None else ""))
        return password

    async def _authorize(self, ref: LogRef, password: bytes | None, force: bool, what: str) -> bytes | None:
        """The password for a destructive step, or None with `force` (then the admin role is needed)."""
        if force:
            role = await self.bk.caller_role()
            if not allowed(role, Operation.ADMINISTER):
                raise UnauthorizedError(f"{what} log {ref.name!r} with force (without its password) needs the admin "
                                        f"role; bookies take this client for role {role}")
            return None
        return self._check_password(ref, password, what)

    def _read_password(self, ref: LogRef, password: bytes | None) -> bytes:
        """Readers need no password for a CRC32C log (the default); a MAC log's entries are signed
        with the password, so reading them needs it."""
        if ref.config.digest is DigestType.MAC:
            return self._check_password(ref, password, "reading the MAC-signed")
        return b""

    # ---- writing and reading ------------------------------------------------------------

    async def open_writer(self, name: str, *, password: bytes, options: WriterOptions | None = None) -> LogWriter:
        """Take the log over as its one writer (epoch + 1): a previous writer is fenced and its
        acknowledged records kept; LogFencedError if a newer writer wins meanwhile."""
        ref = await self.ref(name)
        self._check_password(ref, password, "writing to")
        return await open_writer(self, ref, password, options or WriterOptions())

    async def open_reader(self, name: str, *, start: Start = "earliest", cursor: str | None = None,
                          at_time: int | None = None, end: int | Literal["latest"] | None = None,
                          password: bytes | None = None) -> LogReader:
        """A reader from `start` (an offset, "earliest" or "latest"), or from a cursor's position, or
        from the first record with a timestamp >= `at_time` (ms); to `end` (exclusive; "latest":
        the end now; None: forever). Readers never fence the writer. Reading below the start
        offset raises LogTruncatedError naming it."""
        ref = await self.ref(name)
        pw = self._read_password(ref, password)
        if cursor is not None:
            c = await self.meta.cursor(ref.log_id, cursor)
            if c is None:
                raise CursorError(f"log {name!r} has no cursor {cursor!r}")
            position = c.offset
        elif at_time is not None:
            position = await offset_at_time(self, ref, at_time, pw)
        elif start == "earliest":
            head = await self.meta.head(ref.log_id)
            position = head.start_offset if head else 0
        elif start == "latest":
            position = await end_offset(self, ref, pw)
        elif isinstance(start, int) and start >= 0:
            position = start
        else:
            raise InvalidLogConfigError(f"start must be an offset >= 0, 'earliest' or 'latest', not {start!r}")
        head = await self.meta.head(ref.log_id)
        if head is not None and position < head.start_offset:
            raise LogTruncatedError(name, position, head.start_offset)
        if end == "latest":
            end = await end_offset(self, ref, pw)
        return LogReader(self, ref, position, end, pw)

    async def end_offset(self, name: str, password: bytes | None = None) -> int:
        """The offset after the last acknowledged record."""
        ref = await self.ref(name)
        return await end_offset(self, ref, self._read_password(ref, password))

    async def start_offset(self, name: str) -> int:
        ref = await self.ref(name)
        head = await self.meta.head(ref.log_id)
        return head.start_offset if head else 0

    async def offset_at_time(self, name: str, timestamp: int, password: bytes | None = None) -> int:
        """The offset of the first record whose timestamp (ms) is >= `timestamp` (else the end)."""
        ref = await self.ref(name)
        return await offset_at_time(self, ref, timestamp, self._read_password(ref, password))

    # ---- cursors ------------------------------------------------------------------------

    async def commit(self, name: str, cursor: str, offset: int) -> int:
        """Store `offset` as the next offset of consumer `cursor` (created on first commit), by CAS.
        A cursor never moves back: committing below it raises CursorError naming where it is."""
        check_name(cursor)
        ref = await self.ref(name)
        if offset < 0:
            raise CursorError(f"cursor {cursor!r} of log {name!r}: offsets start at 0, not {offset}")
        current = await self.meta.cursor(ref.log_id, cursor) or Cursor(cursor, -1)
        while True:
            if offset < current.offset:
                raise CursorError(f"cursor {cursor!r} of log {name!r} is at {current.offset}: committing {offset} "
                                  f"would move it back")
            now = await self.meta.put_cursor(ref.log_id, Cursor(cursor, offset, current.version))
            if now is None:
                return offset
            current = now

    async def cursors(self, name: str, password: bytes | None = None) -> list[CursorInfo]:
        """Every cursor of the log with its lag behind the end."""
        ref = await self.ref(name)
        end = await end_offset(self, ref, self._read_password(ref, password))
        return [CursorInfo(c.name, c.offset, max(0, end - c.offset)) for c in await self.meta.cursors(ref.log_id)]

    async def delete_cursor(self, name: str, cursor: str) -> bool:
        ref = await self.ref(name)
        return await self.meta.delete_cursor(ref.log_id, cursor)

    # ---- describing ---------------------------------------------------------------------

    async def describe(self, name: str, password: bytes | None = None) -> LogDescription:
        ref = await self.ref(name)
        head = await self.meta.head(ref.log_id)
        writer = await self.meta.writer_key(ref.log_id)
        segments = [s async for page in self.meta.segments(ref.log_id) for s in page]
        end = await end_offset(self, ref, self._read_password(ref, password))
        cursors = [CursorInfo(c.name, c.offset, max(0, end - c.offset)) for c in await self.meta.cursors(ref.log_id)]
        return LogDescription(name, ref.log_id, ref.config, head.epoch, writer.value.decode() if writer else None,
                              head.start_offset, end, segments, cursors)

    # ---- configuration ------------------------------------------------------------------

    async def reconfigure(self, name: str, config: LogConfig, *, password: bytes | None = None,
                          force: bool = False) -> LogRef:
        """Replace the log's stored configuration (needs its password, or `force` with the admin
        role). Retention applies from the next `enforce_retention`; replication and rollover apply
        to writers opened afterwards (a writer open now keeps the configuration it opened with, so
        its segments keep their replication until it reopens). The digest cannot change: the
        segments already written are signed with it."""
        ref = await self.ref(name)
        await self._authorize(ref, password, force, "reconfiguring")
        config = config.validate()
        if config.digest is not ref.config.digest:
            raise InvalidLogConfigError(f"log {name!r} has digest {ref.config.digest.value}: its segments are "
                                        f"written with it, so it cannot become {config.digest.value}")
        if config != ref.config and not await self.meta.replace_config(name, ref.log_id, config, ref.password_hash):
            raise LogNotFoundError(name)
        return replace(ref, config=config)

    # ---- truncation, retention, deletion ------------------------------------------------

    async def truncate(self, name: str, before: int, *, password: bytes | None = None, force: bool = False) -> int:
        """Delete the whole CLOSED segments all of whose records are below `before`, always a
        prefix of the log (an OPEN segment is never touched); returns the start offset now (at most
        `before`: a segment holding `before` is kept whole). Marks them TRUNCATED and moves the
        start offset in one transaction per batch, then deletes their ledgers, then their keys."""
        ref = await self.ref(name)
        pw = await self._authorize(ref, password, force, "truncating")
        return await self._truncate(ref, before, pw)

    async def _truncate(self, ref: LogRef, before: int, password: bytes | None) -> int:
        meta = self.meta
        doomed: list[Segment] = []
        async for page in meta.segments(ref.log_id):
            prefix = truncation_prefix(page, before)
            doomed += prefix
            if len(prefix) < len(page):
                break
        head = await meta.head(ref.log_id)
        if head is None:
            raise LogNotFoundError(ref.name)
        for i in range(0, len(doomed), 64):
            batch = doomed[i:i + 64]
            change = [replace(s, state=SegmentState.TRUNCATED) for s in batch if s.state is not SegmentState.TRUNCATED]
            while True:
                start = max(head.start_offset, batch[-1].end_offset)
                new_head = Head(head.epoch, head.writer, head.state, head.last_seq, start, head.version)
                ok, now, _ = await meta.commit(ref.log_id, head, new_head, change)
                if ok:
                    head = new_head
                    break
                if now is None or now.state is not LogState.ACTIVE:
                    raise LogNotFoundError(ref.name)
                head = now
        await failpoints.hit("truncate.after_mark")
        for s in doomed:
            await self._delete_ledger(s.ledger_id, password)
        await failpoints.hit("truncate.after_ledgers")
        await meta.delete_segments(ref.log_id, doomed)
        head = await meta.head(ref.log_id)
        return head.start_offset if head else 0

    async def _delete_ledger(self, ledger_id: int, password: bytes | None) -> None:
        try:
            await self.bk.delete_ledger(ledger_id, password, force=password is None)
        except NoSuchLedgerError:
            pass

    async def enforce_retention(self, name: str, *, password: bytes | None = None, force: bool = False,
                                now_ms: int | None = None) -> int | None:
        """Apply the log's retention policy once (retention.retention_before): truncate what it
        allows; returns the new start offset, or None if nothing was due."""
        ref = await self.ref(name)
        pw = await self._authorize(ref, password, force, "enforcing retention on")
        before, _ = await self.retention_point(ref, now_ms if now_ms is not None else int(time.time() * 1000))
        if before is None:
            return None
        return await self._truncate(ref, before, pw)

    async def retention_point(self, ref: LogRef, now_ms: int) -> tuple[int | None, list[Segment]]:
        """What retention allows now: (the offset to truncate before or None, the segments read).
        Segments are read a page at a time, and only as far as the decision needs: a policy with
        a size bound (max_bytes, max_backlog_bytes) needs every closed segment's size, others stop
        at the first page holding a segment that stays."""
        retention = ref.config.retention
        sized = retention.max_bytes is not None or retention.max_backlog_bytes is not None
        cursors = [c.offset for c in await self.meta.cursors(ref.log_id)]
        segments: list[Segment] = []
        async for page in self.meta.segments(ref.log_id):
            segments += page
            if not sized:
                before = retention_before(retention, segments, now_ms, cursors)
                if before is None or before < page[-1].end_offset or page[-1].state is SegmentState.OPEN:
                    break
        return retention_before(retention, segments, now_ms, cursors), segments

    async def delete(self, name: str, *, password: bytes | None = None, force: bool = False) -> None:
        """Delete the log: its name is free at once (creating it again makes a new, empty log),
        then its ledgers and keys go. LogInUseError while a live writer has it open."""
        ref = await self.ref(name)
        pw = await self._authorize(ref, password, force, "deleting")
        meta = self.meta
        while True:
            writer = await meta.writer_key(ref.log_id)
            head = await meta.head(ref.log_id)
            if head is None:
                raise LogNotFoundError(name)
            if writer is not None:
                raise LogInUseError(f"log {name!r} is open for writing by {writer.value.decode()!r} (epoch "
                                    f"{head.epoch}): close that writer first, or wait for its session to expire")
            deleting = Head(head.epoch, head.writer, LogState.DELETING, head.last_seq, head.start_offset)
            if await meta.unname(name, ref.log_id, head, deleting):
                break
            if await meta.resolve(name) != ref.log_id:
                raise LogNotFoundError(name)
        await failpoints.hit("delete.after_name")
        await self._purge(ref.log_id, pw)

    async def _purge(self, log_id: int, password: bytes | None) -> None:
        async for page in self.meta.segments(log_id):
            for s in page:
                await self._delete_ledger(s.ledger_id, password)
        await self.meta.drop(log_id)

    async def reclaim_orphans(self, *, password: bytes | None = None, force: bool = False,
                              log_name: str | None = None) -> list[tuple[int, str]]:
        """Find ledgers made for log segments that were never committed (a writer lost its CAS or
        died between making a ledger and committing it), of deleted logs, or of truncated segments,
        and delete them. Only `log_name`'s with its password, or every log's with `force` (admin).
        Returns (ledger id, why) for each deleted. Scans all ledger metadata, a page at a time."""
        only = await self.ref(log_name) if log_name is not None else None
        if only is not None:
            password = await self._authorize(only, password, force, "reclaiming orphans of")
        elif not force:
            raise UnauthorizedError("reclaiming the orphans of every log needs force (the admin role); "
                                    "give log_name and its password for one log")
        else:
            await self._authorize(LogRef("*", 0, LogConfig(), b""), None, True, "reclaiming orphans of")
        heads: dict[int, Head | None] = {}
        out = []
        async for md in self.bk.store.ledgers.list_metadata():
            owner = ledger_owner(md.custom)
            if owner is None or (only is not None and owner[0] != only.log_id):
                continue
            log_id, seq, epoch = owner
            if log_id not in heads:
                heads[log_id] = await self.meta.head(log_id)
            head = heads[log_id]
            seg = await self.meta.segment(log_id, seq) if head is not None else None
            reason = orphan_reason(md.ledger_id, seq, epoch, head, seg)
            if reason:
                await self._delete_ledger(md.ledger_id, password if only is not None else None)
                out.append((md.ledger_id, reason))
        for log_id, head in heads.items():
            if head is not None and head.state is LogState.DELETING and only is None:
                await self.meta.drop(log_id)   # a delete that stopped after freeing the name
        return out
