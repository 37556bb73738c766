"""The journal: append-only files of checksummed records, fsync'd before any add is acknowledged.

Record layout (big-endian):

    length u32 | crc32c u32 | type u8 | ledger u64 | entry i64 | body

`length` is the body's length; the CRC32C covers type, ledger, entry and body. Adds are written
as ADD_RUN records, one per run of entries of one ledger in a batch: `entry` is their count n and
the body is their entry ids (n x i64), their body sizes (n x u32), then the bodies back to back,
as they came off the wire; one CRC32C covers the run (no work per entry), and replay hands out its
entries as ADD records. (ADD, one entry per record, is what bookies before runs wrote: it is
still replayed, and a journal with runs cannot be replayed by those bookies: downgrade only after
a clean stop, whose checkpoint leaves nothing to replay.) One writer task
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

Integrity: the files and the mark must agree, else start-up refuses (JournalGapError) unless the
operator accepts the loss. Every file starts with a FILE_HEADER record (ledger = its seq, entry =
the previous file's final length, -1 for none; body = its preallocation chunk, u64). `journal.head`
(written atomically after a file is created) holds the highest seq created and the journal's
random id, which the index records. With preallocation (`prealloc` > 0, as BookKeeper's
journalPreAllocSizeMB) a file is extended in whole chunks before data goes there, always leaving
at least a zeroed record header after the data: replay stops at the first zeroed header, and an
intact file's size is a multiple of its chunk.

Detected at start (from the mark's file on): a missing file (a seq between the mark and
journal.head, or a gap between files); a file shorter than the next file's header says; a file
whose header is missing, cut or names another seq; the mark's file shorter than the mark's
offset; a missing journal.head next to journal data; and, for preallocated files, a size that is
not a whole number of chunks, or data running up to (or past) the end of the file with no zeroed
header after it (so the newest file cut anywhere is seen too).
Not detected: a file that is not preallocated (`prealloc` 0) cut after the mark at a point where
a crash could have torn it: that is indistinguishable from a torn tail; and a torn tail after a
crash must be accepted (its records were never acknowledged: the group's fdatasync had not
returned), so a damaged record in the last file with only zeros or nothing after it is cut off,
in a preallocated file by zeroing it. Files before the mark are not checked (their content is in
the entry logs). A whole journal directory swapped for another bookie's is the cookie's job. A
file past journal.head that holds no record is what a stop in the middle of a roll leaves (records
go to a file only after journal.head names it): start-up removes it (discard_unused).
"""
from __future__ import annotations

import asyncio
import enum
import errno
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, NamedTuple, Sequence

import google_crc32c
import numpy as np

from pybk.config import option_field

RECORD = struct.Struct(">IIBQq")
RECORD_HEADER = RECORD.size  # 25
_CRC_PART = struct.Struct(">BQq")
MAX_BODY = 64 * 1024 * 1024  # a length above this is corruption, not a torn write
MARK_FILE = "journal.mark"
HEAD_FILE = "journal.head"
_IOV_MAX = min(os.sysconf("SC_IOV_MAX"), 1024) if hasattr(os, "sysconf") else 1024
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
    FILE_HEADER = 5
    ADD_RUN = 6


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


class JournalGap(NamedTuple):
    """Journal content that should be there and is not: `lost_from` is the byte offset in `path`
    from which it is gone (0: the whole file)."""
    path: Path
    what: str
    lost_from: int = 0

    def __str__(self) -> str:
        return f"journal file {self.path} {self.what}"


class JournalGapError(Exception):
    """Journal files and the mark disagree: acknowledged entries may be lost, start-up must stop."""

    def __init__(self, gaps: list[JournalGap]):
        self.gaps = gaps
        super().__init__(
            "; ".join(map(str, gaps)) + ": restore it from a backup, or start with --accept-journal-loss.\n"
            "Entries this bookie acknowledged from there on may be lost. With --accept-journal-loss the bookie "
            "starts, logs the lost range and marks every ledger it is in under-replicated, so autorecovery "
            "copies the entries back from the other replicas.")


class _FileHeader(NamedTuple):
    seq: int
    prev_length: int
    prealloc: int


_PREALLOC = struct.Struct(">Q")
_ADD, _ADD_RUN, _FILE_HEADER = int(RecordType.ADD), int(RecordType.ADD_RUN), int(RecordType.FILE_HEADER)
FILE_HEADER_SIZE = RECORD_HEADER + _PREALLOC.size
_ZERO_HEADER = bytes(RECORD_HEADER)


def crc32c_extend(crc: int, data: bytes | memoryview) -> int:
    """google_crc32c.extend, for views too (entry bodies left in the bytes an Add batch came in):
    it takes bytes and arrays but no memoryview."""
    return google_crc32c.extend(crc, np.frombuffer(data, np.uint8) if type(data) is memoryview else data)


def encode_run(ledger: int, entry_ids: Sequence[int], sizes: Sequence[int], bodies: bytes | memoryview) -> list:
    """One ADD_RUN record of `ledger`'s entries (ids, body sizes, the bodies back to back) as the
    parts Journal.append takes; the bodies are passed on, not copied."""
    n = len(entry_ids)
    index = struct.pack(f">{n}q{n}I", *entry_ids, *sizes)
    crc = crc32c_extend(google_crc32c.extend(google_crc32c.value(_CRC_PART.pack(_ADD_RUN, ledger, n)), index), bodies)
    return [RECORD.pack(len(index) + len(bodies), crc, _ADD_RUN, ledger, n), index, bodies]


def _run_index(n: int, body: bytes) -> tuple | None:
    """An ADD_RUN body's entry ids then body sizes, None if they do not fit the body."""
    if n < 0 or 12 * n > len(body):
        return None
    fields = struct.unpack_from(f">{n}q{n}I", body)
    return fields if 12 * n + sum(fields[n:]) == len(body) else None


def _run_entries(record: Record) -> Iterator[Record]:
    """The ADD records of an ADD_RUN record whose index scan_file checked."""
    n = record.entry
    body = record.body
    fields = _run_index(n, body)
    pos = 12 * n
    for eid, size in zip(fields[:n], fields[n:]):
        yield Record(_ADD, record.ledger, eid, body[pos:pos + size])
        pos += size


def require_room(fd: int, need: int, what: str) -> None:
    """Raise ENOSPC, before anything is written, when fd's file system has no room for `need` more
    bytes (as an unprivileged writer counts free space)."""
    st = os.fstatvfs(fd)
    free = st.f_bavail * st.f_frsize
    if free < need:
        raise OSError(errno.ENOSPC, f"{what}: {need} bytes to write, {free} free")


def is_space_error(exc: BaseException) -> bool:
    """True for an error that only says the disk (or a quota or size limit) has no room."""
    return isinstance(exc, OSError) and exc.errno in SPACE_ERRNOS


def encode_record(rtype: int, ledger: int, entry: int, body: bytes = b"") -> bytes:
    """One journal record as bytes."""
    crc = google_crc32c.extend(google_crc32c.value(_CRC_PART.pack(rtype, ledger, entry)), body)
    return RECORD.pack(len(body), crc, rtype, ledger, entry) + body


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


def _read_checked(path: Path, layout: struct.Struct) -> tuple | None:
    """A small file of `layout` fields followed by their CRC32C; None when there is none."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    if len(data) != layout.size + 4:
        raise JournalCorruptError(path, 0, f"file has {len(data)} bytes, expected {layout.size + 4}")
    if struct.unpack_from(">I", data, layout.size)[0] != google_crc32c.value(data[:layout.size]):
        raise JournalCorruptError(path, 0, "checksum mismatch")
    return layout.unpack_from(data)


def _write_checked(path: Path, layout: struct.Struct, *fields: int) -> None:
    """Persist fields with their CRC32C, atomically."""
    head = layout.pack(*fields)
    write_atomic(path, head + struct.pack(">I", google_crc32c.value(head)))


def write_atomic(path: Path, data: bytes) -> None:
    """Replace a small file so that a crash leaves the old or the new content (write, fsync,
    rename, fsync dir)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


_MARK_FIELDS = struct.Struct(">QQ")
_HEAD_FIELDS = struct.Struct(">Q16s")


class Head(NamedTuple):
    """journal.head: the highest file seq created and the journal's random id (made with its
    first file; the index records it, so an index from another journal is refused)."""
    seq: int
    journal_id: bytes


def read_mark(directory: Path) -> Mark:
    """The persisted journal mark, or (0, 0) when there is none yet."""
    fields = _read_checked(directory / MARK_FILE, _MARK_FIELDS)
    return Mark(*fields) if fields else Mark(0, 0)


def write_mark(directory: Path, mark: Mark) -> None:
    """Persist the mark atomically."""
    _write_checked(directory / MARK_FILE, _MARK_FIELDS, mark.seq, mark.offset)


def read_head(directory: Path) -> Head:
    """journal.head, or (0, b"") when no journal file was ever created here."""
    fields = _read_checked(directory / HEAD_FILE, _HEAD_FIELDS)
    return Head(*fields) if fields else Head(0, b"")


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def encode_file_header(seq: int, prev_length: int, prealloc: int) -> bytes:
    """The record every journal file starts with."""
    return encode_record(RecordType.FILE_HEADER, seq, prev_length, _PREALLOC.pack(prealloc))


def parse_file_header(data: bytes) -> _FileHeader | None:
    """The file header at the start of `data`, None if it is not there intact."""
    if len(data) < FILE_HEADER_SIZE:
        return None
    length, crc, rtype, seq, prev = RECORD.unpack_from(data)
    body = data[RECORD_HEADER:FILE_HEADER_SIZE]
    if (rtype != RecordType.FILE_HEADER or length != _PREALLOC.size
            or crc != google_crc32c.extend(google_crc32c.value(data[8:RECORD_HEADER]), body)):
        return None
    return _FileHeader(seq, prev, _PREALLOC.unpack(body)[0])


class FileFacts(NamedTuple):
    """What start-up knows of one journal file without reading all of it."""
    size: int
    header: _FileHeader | None


def survey(directory: Path, mark: Mark) -> tuple[int, dict[int, FileFacts]]:
    """journal.head and the size and header of every file from the mark's on (I/O for find_gaps)."""
    files: dict[int, FileFacts] = {}
    for seq, path in journal_files(directory):
        if seq < mark.seq:
            continue
        with open(path, "rb") as f:
            head = f.read(FILE_HEADER_SIZE)
            files[seq] = FileFacts(os.fstat(f.fileno()).st_size, parse_file_header(head))
    return read_head(directory).seq, files


def find_gaps(directory: Path, mark: Mark, head: int, files: dict[int, FileFacts]) -> list[JournalGap]:
    """Where the journal files disagree with the mark, journal.head and their own headers (pure:
    survey() gathers the facts). Empty for an intact journal; see the module doc for the rules."""
    def path(seq: int) -> Path:
        return journal_path(directory, seq)

    if not head:
        if files or mark.seq:
            return [JournalGap(directory / HEAD_FILE, "is missing while journal data is there: newer journal "
                               "files may have been deleted")]
        return []
    gaps: list[JournalGap] = []
    first = mark.seq or 1  # before the first checkpoint no file was deleted
    for seq in range(first, max(head, max(files, default=0)) + 1):
        facts = files.get(seq)
        if facts is None:
            gaps.append(JournalGap(path(seq), "is missing (journal.head says files up to "
                                   f"{head} were created, the mark is in file {mark.seq})"))
            continue
        h = facts.header
        if h is None:
            gaps.append(JournalGap(path(seq), f"has no intact file header (it is {facts.size} bytes): it was "
                                   "cut or overwritten"))
            continue
        if h.seq != seq:
            gaps.append(JournalGap(path(seq), f"holds journal file {h.seq}: it was renamed or copied"))
        prev = files.get(seq - 1)
        if seq > first and prev is not None and 0 <= h.prev_length != prev.size:
            if prev.size < h.prev_length:
                gaps.append(JournalGap(path(seq - 1), f"is {prev.size} bytes but ended at {h.prev_length} "
                                       f"(the next file's header says): {h.prev_length - prev.size} bytes "
                                       "were cut off", prev.size))
        if seq == mark.seq and facts.size < mark.offset:
            gaps.append(JournalGap(path(seq), f"is {facts.size} bytes but the journal mark is at offset "
                                   f"{mark.offset}: it was cut", facts.size))
        elif h.prealloc and facts.size % h.prealloc:
            gaps.append(JournalGap(path(seq), f"is {facts.size} bytes, not a whole number of its "
                                   f"{h.prealloc}-byte preallocation chunks: it was cut",
                                   facts.size - facts.size % h.prealloc))
    return gaps


def discard_unused(directory: Path) -> list[Path]:
    """Delete files past journal.head that hold no record: a roll that the bookie's stop
    interrupted before journal.head named the new file (records only go to a file after that).
    Returns what was deleted."""
    head = read_head(directory).seq
    removed = []
    for seq, path in journal_files(directory):
        if seq <= head:
            continue
        with open(path, "rb") as f:
            start = f.read(FILE_HEADER_SIZE + RECORD_HEADER)
        header, first = start[:FILE_HEADER_SIZE], start[FILE_HEADER_SIZE:]
        if (parse_file_header(header) is not None or not header.strip(b"\0")) and not first.strip(b"\0"):
            path.unlink()
            removed.append(path)
    if removed:
        fsync_dir(directory)
    return removed


def check(directory: Path, mark: Mark) -> list[JournalGap]:
    """The journal's gaps (I/O + find_gaps)."""
    return find_gaps(directory, mark, *survey(directory, mark))


def _cut(path: Path, gap_from: int, what: str) -> JournalGapError:
    return JournalGapError([JournalGap(path, what, gap_from)])


def scan_file(path: Path, start: int, is_last: bool, accept_cut: bool = False) -> Iterator[Record]:
    """Yield the records of one journal file from `start` (its FILE_HEADER record too).

    A damaged record at the very end of the last file is a torn write: it is cut off (truncated,
    or zeroed in a preallocated file) and replay stops. A damaged record followed by more data
    raises JournalCorruptError. A preallocated file whose data runs to its end raises
    JournalGapError (it was cut), unless accept_cut, which treats that end as the end.
    """
    data = path.read_bytes()
    size = len(data)
    header = parse_file_header(data)
    prealloc = header.prealloc if header is not None else 0
    data_end = len(data.rstrip(b"\0")) if prealloc else size
    pos = start
    while pos < size:
        reason = None
        if prealloc and pos >= data_end:
            return  # the zeroed rest of a preallocated file
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
                elif rtype == _ADD_RUN and _run_index(entry, body) is None:
                    reason = "a run record whose entry sizes do not add up to its body"
        if prealloc and end + RECORD_HEADER > size:
            # a preallocated file always has room for what was written and a zeroed header after it
            if accept_cut:
                return
            raise _cut(path, size, f"ends inside its data at {size} bytes (a preallocated file keeps zeros "
                                   "after its last record): it was cut")
        if reason is not None:
            if end >= data_end and (is_last or accept_cut):
                with open(path, "r+b") as f:
                    if prealloc:
                        f.seek(pos)
                        f.write(bytes(data_end - pos))
                    else:
                        f.truncate(pos)
                    os.fsync(f.fileno())
                return
            raise JournalCorruptError(path, pos, reason)
        yield Record(rtype, ledger, entry, body)
        pos = end


_TYPES = {int(t) for t in RecordType}


def replay(directory: Path, mark: Mark, accept_loss: bool = False) -> Iterator[Record]:
    """Every data record from the mark on, oldest first (torn tail cut off, corruption refused),
    a run's entries as ADD records. With accept_loss, a cut file's end is taken as its end (the
    caller reported the gap)."""
    files = [(seq, p) for seq, p in journal_files(directory) if seq >= mark.seq]
    for i, (seq, path) in enumerate(files):
        for rec in scan_file(path, mark.offset if seq == mark.seq else 0, i == len(files) - 1, accept_loss):
            if rec.type == _ADD_RUN:
                yield from _run_entries(rec)
            elif rec.type != _FILE_HEADER:
                yield rec


@dataclass(frozen=True)
class JournalOptions:
    """How the journal writes: file size, group commit, fdatasync, preallocation (journal_* options)."""

    max_file_size: int = option_field("journal_max_file_size")
    group_wait: float = option_field("journal_group_wait")
    group_max_bytes: int = option_field("journal_group_max_bytes")
    fsync: bool = option_field("journal_fsync")
    inline_bytes: int = option_field("journal_inline_bytes")  # groups up to this size are written on the loop
    prealloc_size: int = option_field("journal_prealloc_size")  # files grow in chunks of this (0 = not)


class Journal:
    """The group-commit writer. append() returns once the records are on disk (fdatasync'd)."""

    def __init__(self, directory: Path, options: JournalOptions = JournalOptions(),
                 on_sync: Callable[[float, int, int], None] | None = None,
                 on_error: Callable[[BaseException, bool], None] | None = None):
        self.directory = Path(directory)
        self.options = options
        prealloc = options.prealloc_size
        self.prealloc = min(prealloc, options.max_file_size) if prealloc > 0 else 0  # chunk files grow by
        self._allocated = 0  # bytes preallocated in the current file
        self._sync_seconds = 0.0  # moving average of a group commit's write + fdatasync (not the hop to a thread)
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
        self.journal_id = b""  # set by open() from journal.head (or made new)

    def open(self) -> None:
        """Start a fresh journal file after the last one ever created (call after replay)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        files = journal_files(self.directory)
        head = read_head(self.directory)
        self.journal_id = head.journal_id or os.urandom(16)
        last = max(head.seq, files[-1][0] if files else 0)
        prev = journal_path(self.directory, last)
        self._roll(last + 1, prev.stat().st_size if last and prev.exists() else -1)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="journal-writer")

    def _roll(self, seq: int, prev_length: int) -> None:
        """Create file seq (header, preallocation, durable), then record it in journal.head."""
        path = journal_path(self.directory, seq)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            header = encode_file_header(seq, prev_length, self.prealloc)
            self._allocated = 0
            if self.prealloc:
                os.posix_fallocate(fd, 0, self.prealloc)
                self._allocated = self.prealloc
            os.pwrite(fd, header, 0)
            os.fdatasync(fd)
            fsync_dir(self.directory)
            _write_checked(self.directory / HEAD_FILE, _HEAD_FIELDS, seq, self.journal_id)
        except BaseException:  # e.g. no room to preallocate: go on in the current file
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = fd
        self._seq, self._offset = seq, len(header)
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
            if self.options.group_wait > 0 and self._queued_bytes < self.options.group_max_bytes:
                await asyncio.sleep(self.options.group_wait)
            while self._queue:
                taken, size = 0, 0
                while taken < len(self._queue) and (size < self.options.group_max_bytes or not taken):
                    size += self._queue[taken][1]
                    taken += 1
                group, self._queue = self._queue[:taken], self._queue[taken:]
                self._queued_bytes -= size
                parts: list[bytes] = []
                for p, _, _ in group:
                    parts.extend(p)
                self._busy = True
                try:
                    if size <= self.options.inline_bytes and self._sync_seconds < INLINE_MAX_SYNC_SECONDS:
                        took = self._write(parts, size)
                    else:
                        took = await loop.run_in_executor(None, self._write, parts, size)
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
                self._sync_seconds += (took - self._sync_seconds) / 8
                if self.on_sync:
                    self.on_sync(took, size, len(group))
                for _, _, f in group:
                    if not f.done():
                        f.set_result(None)

    def _write(self, parts: list[bytes], size: int) -> float:
        """Runs in a worker thread: writev the parts, one fdatasync, rotate when the file is full;
        returns the seconds that took. Timed here, not around the hop to the thread: a busy loop
        that is slow to pick the result up must not make the disk look slow and keep small groups
        off the loop.
        Raises ENOSPC before writing anything when the file system has no room for the group: a
        preallocated file needs room only when the group outgrows its chunks, and fallocate then
        reserves it or fails; without preallocation the free space is checked."""
        t0 = time.perf_counter()
        if not self.prealloc:
            require_room(self._fd, size, f"journal {self.directory}")
        elif self._offset + size + RECORD_HEADER > self._allocated:
            grow = -(-(self._offset + size + RECORD_HEADER - self._allocated) // self.prealloc) * self.prealloc
            os.posix_fallocate(self._fd, self._allocated, grow)
            self._allocated += grow
        offset = self._offset
        for i in range(0, len(parts), _IOV_MAX):
            chunk = parts[i:i + _IOV_MAX]
            want = sum(map(len, chunk))
            n = os.pwritev(self._fd, chunk, offset)
            if n < want:  # short write: finish the rest the slow way
                view = memoryview(b"".join(chunk))[n:]
                while view:
                    view = view[os.pwrite(self._fd, view, offset + want - len(view)):]
            offset += want
        if self.options.fsync:
            os.fdatasync(self._fd)
        self._offset += size
        self._written = Mark(self._seq, self._offset)
        if self._offset >= self.options.max_file_size:
            self._roll(self._seq + 1, os.fstat(self._fd).st_size)
        return time.perf_counter() - t0

    def _cut_back(self) -> bool:
        """Remove what a failed group left after the last good record (zero it in a preallocated
        file, whose size must stay whole chunks); False if that failed too."""
        try:
            if self._allocated:
                size = os.fstat(self._fd).st_size
                if size > self._allocated:  # a failed extension may have grown the file
                    os.ftruncate(self._fd, self._allocated)
                end = min(size, self._allocated)
                zeros = bytes(min(end - self._offset, 1024 * 1024)) if end > self._offset else b""
                for at in range(self._offset, end, len(zeros) or 1):
                    os.pwrite(self._fd, zeros[:end - at], at)
            else:
                os.ftruncate(self._fd, self._offset)
            if self.options.fsync:
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
