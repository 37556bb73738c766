"""The journal: append-only files of checksummed records, fsync'd before any add is acknowledged.

Record layout (big-endian):

    length u32 | crc32c u32 | type u8 | ledger u64 | entry i64 | body

`length` is the body's length; the CRC32C covers type, ledger, entry and body. One writer task
does group commit: it takes everything queued, writes it with one write and one fdatasync, then
completes all of those appends at once. A small group (a lone add, the window-1 case) is written
and synced right on the event loop while the disk syncs fast (under INLINE_MAX_SYNC_SECONDS on
average): the hop to a worker thread and back costs more CPU and latency than the fdatasync
itself. A big group, or any group on a slow disk, goes to a worker thread, so the loop keeps
serving reads and taking the next batches in while the disk syncs.

A full disk never leaves half a group behind: a group is written only when the file system has
room for all of it (else ENOSPC, nothing written), and a write or fdatasync that fails anyway is
cut back off the file, so the next group lands right after the last good record and the mark
never points past a hole. Those waiters fail (their adds were never acknowledged); the journal
goes on taking groups, so the bookie is writable again once space returns. Only if the cut
itself fails, or the error is not about space (an I/O error: after a failed fdatasync the page
cache cannot be trusted), does the journal stop for good until a restart replays it.

Files are named `journal-<seq>.log` and rotate by size. The journal mark (file seq, offset) says
where replay starts; files before it are deleted once a checkpoint made their content durable
elsewhere.
"""
from __future__ import annotations

import asyncio
import enum
import errno
import os
import struct
import time
from pathlib import Path
from typing import Callable, Iterator, NamedTuple

import google_crc32c

RECORD = struct.Struct(">IIBQq")
RECORD_HEADER = RECORD.size  # 25
_CRC_PART = struct.Struct(">BQq")
MAX_BODY = 64 * 1024 * 1024  # a length above this is corruption, not a torn write
MARK_FILE = "journal.mark"
_IOV_MAX = min(os.sysconf("SC_IOV_MAX"), 1024) if hasattr(os, "sysconf") else 1024
_MARK = struct.Struct(">QQI")
# Errors that only say the disk has no room: the journal cuts the group back and goes on.
SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
# Small groups are written on the event loop only while the disk syncs this fast: on a slow disk
# the loop would stall reads and everything else for the whole fdatasync.
INLINE_MAX_SYNC_SECONDS = 0.001


class RecordType(enum.IntEnum):
    ADD = 1
    FENCE = 2
    MASTER_KEY = 3
    LAC = 4


class Record(NamedTuple):
    type: int
    ledger: int
    entry: int
    body: bytes


class Mark(NamedTuple):
    """A journal position: everything before it is durable outside the journal."""
    seq: int
    offset: int


class JournalCorruptError(Exception):
    """A record in the middle of the journal is damaged: start-up must stop."""

    def __init__(self, path: Path, offset: int, reason: str):
        self.path, self.offset = path, offset
        super().__init__(
            f"journal file {path} is corrupt at offset {offset}: {reason}. Valid records follow it, so "
            f"this is not a torn tail and the bookie refuses to skip it silently. Restore the journal "
            f"from a backup, or, if this bookie's data is to be discarded, remove its journal and ledger "
            f"dirs (and its cookie in the metadata store) and let autorecovery re-replicate.")


def encode_records(rtype: int, ledger: int, bodies: dict[int, bytes]) -> list[bytes]:
    """Records of one type and ledger, one per entry id -> body, as the parts Journal.append takes:
    header, body, header, body, ... (bodies are not copied). Adds call it once per ledger of a batch."""
    pack, part, value, extend = RECORD.pack, _CRC_PART.pack, google_crc32c.value, google_crc32c.extend
    parts: list[bytes] = [b""] * (2 * len(bodies))
    parts[::2] = [pack(len(body), extend(value(part(rtype, ledger, entry)), body), rtype, ledger, entry)
                  for entry, body in bodies.items()]
    parts[1::2] = bodies.values()
    return parts


def is_space_error(exc: BaseException) -> bool:
    """True for an error that only says the disk (or a quota or size limit) has no room."""
    return isinstance(exc, OSError) and exc.errno in SPACE_ERRNOS


def encode_record(rtype: int, ledger: int, entry: int, body: bytes = b"") -> bytes:
    """One journal record as bytes."""
    return b"".join(encode_records(rtype, ledger, {entry: body}))


def journal_path(directory: Path, seq: int) -> Path:
    return directory / f"journal-{seq:016x}.log"


def journal_files(directory: Path) -> list[tuple[int, Path]]:
    """(seq, path) of every journal file, oldest first."""
    out = []
    for p in directory.glob("journal-*.log"):
        try:
            out.append((int(p.stem.split("-", 1)[1], 16), p))
        except ValueError:
            continue
    return sorted(out)


def read_mark(directory: Path) -> Mark:
    """The persisted journal mark, or (0, 0) when there is none yet."""
    try:
        data = (directory / MARK_FILE).read_bytes()
    except FileNotFoundError:
        return Mark(0, 0)
    if len(data) != _MARK.size:
        raise JournalCorruptError(directory / MARK_FILE, 0, f"mark file has {len(data)} bytes, expected {_MARK.size}")
    seq, offset, crc = _MARK.unpack(data)
    if crc != google_crc32c.value(data[:16]):
        raise JournalCorruptError(directory / MARK_FILE, 0, "mark file checksum mismatch")
    return Mark(seq, offset)


def write_mark(directory: Path, mark: Mark) -> None:
    """Persist the mark atomically (write, fsync, rename, fsync dir)."""
    head = struct.pack(">QQ", mark.seq, mark.offset)
    tmp = directory / (MARK_FILE + ".tmp")
    with open(tmp, "wb") as f:
        f.write(head + struct.pack(">I", google_crc32c.value(head)))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, directory / MARK_FILE)
    fsync_dir(directory)


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def scan_file(path: Path, start: int, is_last: bool) -> Iterator[Record]:
    """Yield the records of one journal file from `start`.

    A damaged record at the very end of the last file is a torn write: the file is truncated
    there and replay stops. A damaged record followed by more data raises JournalCorruptError.
    """
    data = path.read_bytes()
    size = len(data)
    pos = start
    while pos < size:
        reason = None
        if size - pos < RECORD_HEADER:
            reason, end = "incomplete record header", size
        else:
            length, crc, rtype, ledger, entry = RECORD.unpack_from(data, pos)
            end = pos + RECORD_HEADER + length
            if length > MAX_BODY:
                raise JournalCorruptError(path, pos, f"record length {length} is impossible")
            if end > size:
                reason = f"record of {length} bytes runs past the end of the file"
            else:
                body = data[pos + RECORD_HEADER:end]
                actual = google_crc32c.extend(google_crc32c.value(data[pos + 8:pos + RECORD_HEADER]), body)
                if actual != crc or rtype not in _TYPES:
                    reason = "checksum mismatch" if actual != crc else f"unknown record type {rtype}"
        if reason is not None:
            if end >= size and is_last:
                with open(path, "r+b") as f:
                    f.truncate(pos)
                    os.fsync(f.fileno())
                return
            raise JournalCorruptError(path, pos, reason)
        yield Record(rtype, ledger, entry, body)
        pos = end


_TYPES = {int(t) for t in RecordType}


def replay(directory: Path, mark: Mark) -> Iterator[Record]:
    """Every record from the mark on, oldest first (torn tail truncated, corruption refused)."""
    files = [(seq, p) for seq, p in journal_files(directory) if seq >= mark.seq]
    for i, (seq, path) in enumerate(files):
        yield from scan_file(path, mark.offset if seq == mark.seq else 0, i == len(files) - 1)


class Journal:
    """The group-commit writer. append() returns once the records are on disk (fdatasync'd)."""

    def __init__(self, directory: Path, max_file_size: int = 512 * 1024 * 1024, group_wait: float = 0.0,
                 group_max_bytes: int = 16 * 1024 * 1024, fsync: bool = True,
                 on_sync: Callable[[float, int, int], None] | None = None,
                 on_error: Callable[[BaseException, bool], None] | None = None, inline_max_bytes: int = 64 * 1024):
        self.directory = Path(directory)
        self.max_file_size = max_file_size
        self.group_wait = group_wait
        self.group_max_bytes = group_max_bytes
        self.fsync = fsync
        self.inline_max_bytes = inline_max_bytes  # groups up to this size are written on the loop
        self._sync_seconds = 0.0  # moving average of a group commit's duration
        self.on_sync = on_sync  # (seconds, bytes, appends) after every group commit
        self.on_error = on_error  # (exc, recoverable) when a group fails; not recoverable: the journal stopped
        self._queue: list[tuple[list[bytes], int, asyncio.Future]] = []
        self._queued_bytes = 0
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._fd = -1
        self._seq = 0
        self._offset = 0
        self._written = Mark(0, 0)
        self._error: BaseException | None = None
        self._busy = False

    def open(self) -> None:
        """Start a fresh journal file after the last existing one (call after replay)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        files = journal_files(self.directory)
        self._roll(files[-1][0] + 1 if files else 1)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="journal-writer")

    def _roll(self, seq: int) -> None:
        if self._fd >= 0:
            os.close(self._fd)
        path = journal_path(self.directory, seq)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        fsync_dir(self.directory)
        self._seq, self._offset = seq, os.fstat(self._fd).st_size
        self._written = Mark(seq, self._offset)

    @property
    def position(self) -> Mark:
        """The end of what is written. Taken right after a write cache snapshot it is a safe
        checkpoint mark: every record before it was appended before the snapshot (so it is in it)."""
        return self._written

    @property
    def queued_bytes(self) -> int:
        """Bytes waiting for the writer."""
        return self._queued_bytes

    def append(self, data: bytes | list[bytes], size: int | None = None) -> asyncio.Future:
        """Queue encoded records (bytes, or a list of parts written back to back); the future
        completes once they are fdatasync'd. Parts are handed to writev, so the event loop never
        copies them. `size`, when the caller knows it, saves summing the parts."""
        fut = asyncio.get_running_loop().create_future()
        if self._error is not None:
            fut.set_exception(OSError(f"journal failed earlier: {self._error}"))
            return fut
        parts = data if isinstance(data, list) else [data]
        if size is None:
            size = sum(map(len, parts))
        self._queue.append((parts, size, fut))
        self._queued_bytes += size
        self._wakeup.set()
        return fut

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            if self.group_wait > 0 and self._queued_bytes < self.group_max_bytes:
                await asyncio.sleep(self.group_wait)
            while self._queue:
                taken, size = 0, 0
                while taken < len(self._queue) and (size < self.group_max_bytes or not taken):
                    size += self._queue[taken][1]
                    taken += 1
                group, self._queue = self._queue[:taken], self._queue[taken:]
                self._queued_bytes -= size
                parts: list[bytes] = []
                for p, _, _ in group:
                    parts.extend(p)
                t0 = time.perf_counter()
                self._busy = True
                try:
                    if size <= self.inline_max_bytes and self._sync_seconds < INLINE_MAX_SYNC_SECONDS:
                        self._write(parts, size)
                    else:
                        await loop.run_in_executor(None, self._write, parts, size)
                except BaseException as exc:  # noqa: BLE001 - fail the group; stop unless it was space
                    recoverable = is_space_error(exc) and self._cut_back()
                    failed = group if recoverable else group + self._queue
                    for _, _, f in failed:
                        if not f.done():
                            f.set_exception(OSError(f"journal write failed: {exc}"))
                    if not recoverable:
                        self._error = exc
                        self._queue.clear()
                        self._queued_bytes = 0
                    if isinstance(exc, asyncio.CancelledError):
                        raise
                    if self.on_error:
                        self.on_error(exc, recoverable)
                    continue
                finally:
                    self._busy = False
                took = time.perf_counter() - t0
                self._sync_seconds += (took - self._sync_seconds) / 8
                if self.on_sync:
                    self.on_sync(took, size, len(group))
                for _, _, f in group:
                    if not f.done():
                        f.set_result(None)

    def _write(self, parts: list[bytes], size: int) -> None:
        """Runs in a worker thread: writev the parts, one fdatasync, rotate when the file is full.
        Raises ENOSPC before writing anything when the file system has no room for the group."""
        st = os.fstatvfs(self._fd)
        if st.f_bavail * st.f_frsize < size:
            raise OSError(errno.ENOSPC, f"journal {self.directory}: {size} bytes to write, "
                                        f"{st.f_bavail * st.f_frsize} free")
        for i in range(0, len(parts), _IOV_MAX):
            chunk = parts[i:i + _IOV_MAX]
            want = sum(map(len, chunk))
            n = os.writev(self._fd, chunk)
            if n < want:  # short write: finish the rest the slow way
                view = memoryview(b"".join(chunk))[n:]
                while view:
                    view = view[os.write(self._fd, view):]
        if self.fsync:
            os.fdatasync(self._fd)
        self._offset += size
        self._written = Mark(self._seq, self._offset)
        if self._offset >= self.max_file_size:
            self._roll(self._seq + 1)

    def _cut_back(self) -> bool:
        """Remove what a failed group left after the last good record; False if that failed too."""
        try:
            os.ftruncate(self._fd, self._offset)
            if self.fsync:
                os.fdatasync(self._fd)
            return True
        except OSError:
            return False

    def delete_before(self, mark: Mark) -> int:
        """Remove journal files older than the mark's file; returns how many were removed."""
        removed = 0
        for seq, path in journal_files(self.directory):
            if seq < mark.seq and seq != self._seq:
                path.unlink(missing_ok=True)
                removed += 1
        return removed

    async def close(self) -> None:
        """Flush what is queued, then stop the writer and close the file."""
        while (self._queue or self._busy) and self._error is None:
            await asyncio.sleep(0.001)
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
