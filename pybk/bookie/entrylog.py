"""Entry log files: where checkpointed entries live, `length u32 | crc32c u32 | ledger u64 |
entry i64 | body` each.

A location is (log id, offset of the record). A checkpoint appends one sorted batch with one
write and one fsync; reads use pread on a cached descriptor per file.

With direct I/O (the default where the file system allows O_DIRECT, as BookKeeper's
DirectEntryLogger) a batch is copied into one reused, page-aligned buffer and written from there
past the page cache, in whole 4 KiB blocks: the zeros after its last record, up to the block's
end, are padding (a record header of zeros is never a record: its CRC32C would not be zero), and
the next batch starts on the next block. Writing through the page cache costs the bookie a
kernel copy of every byte into fresh cache pages and leaves a checkpoint's worth of dirty pages
that its fsync then writes out at once, stalling the journal's fdatasyncs on the same disk for
up to hundreds of milliseconds; direct writes cost a copy into the hot buffer and leave nothing
for the fsync but the device's cache.

Failure modes: a batch is only appended when the file system has room for all of it (else
ENOSPC before a byte is written); a write or fsync that fails anyway (the disk filled meanwhile,
an I/O error) is cut back off the file, so no partial record stays where the next batch's
locations would be computed (if even the cut fails, the log rolls to a new file). The caller
indexes a batch only after append_sorted returned, so a failed batch leaves no trace. The CRC32C covers ledger,
entry and body, so the bookie itself refuses a record that rotted on disk (readers also verify
the entry's own digest, but a copier without a MAC ledger's password cannot).
"""
from __future__ import annotations

import errno
import logging
import mmap
import os
import struct
from pathlib import Path
from typing import Iterator, Sequence

import google_crc32c
import numpy as np

from .index import KEY, LOCATION
from .journal import _IOV_MAX, MAX_BODY, crc32c_extend, fsync_dir, require_room

LOG_RECORD = struct.Struct(">IIQq")
LOG_HEADER = LOG_RECORD.size  # 24
# a record header as a numpy record, to check the headers of a run of records at once
_RECORD_DTYPE = np.dtype([("length", ">u4"), ("crc", ">u4"), ("ledger", ">u8"), ("entry", ">i8")])
_RECORD_POS = np.arange(LOG_HEADER)
_IDS = struct.Struct(">Qq")
BLOCK = 4096                 # direct writes start and end on a block boundary
DIRECT_BUFFER = 8 << 20      # bytes per direct write, from one aligned buffer per entry log
_ZERO_HEADER = bytes(LOG_HEADER)

log = logging.getLogger(__name__)


def padded(size: int) -> int:
    """size rounded up to whole blocks: what a direct append of `size` bytes takes on disk."""
    return -(-size // BLOCK) * BLOCK


def record_crc(ledger: int, entry: int, body: bytes | memoryview) -> int:
    """The CRC32C stored with a record: over its ledger and entry ids and its body."""
    return crc32c_extend(google_crc32c.value(_IDS.pack(ledger, entry)), body)


class EntryLogCorruptError(OSError):
    """A location in the index points at a record that does not match, or the record rotted."""


class EntryLog:
    """The entry log files of one ledger directory."""

    def __init__(self, directory: Path, max_file_size: int = 1024 * 1024 * 1024, direct_io: bool = True):
        self.directory = Path(directory) / "entrylogs"
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_file_size = max_file_size
        self.direct_io = direct_io
        self._buffer: mmap.mmap | None = None   # direct writes' aligned buffer, made at the first
        self._readers: dict[int, int] = {}
        ids = self.log_ids()
        self._current = ids[-1] if ids else 1
        self._fd = self._open_for_append(self.path(self._current))
        self._offset = os.fstat(self._fd).st_size

    def _open_for_append(self, path: Path) -> int:
        """The descriptor appends go through: O_DIRECT while direct_io holds (a file system that
        refuses it, as older tmpfs does, turns direct_io off with a warning), else O_APPEND."""
        if self.direct_io:
            try:
                return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                log.warning("%s: the file system refuses direct I/O (O_DIRECT); entry logs are written through "
                            "the page cache", self.directory)
                self.direct_io = False
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def path(self, log_id: int) -> Path:
        return self.directory / f"entrylog-{log_id:08x}.log"

    def log_ids(self) -> list[int]:
        return sorted(int(p.stem.split("-", 1)[1], 16) for p in self.directory.glob("entrylog-*.log"))

    def append_sorted(self, items: list[tuple[int, int, bytes]], dir_index: int = 0) -> list[tuple[bytes, bytes]]:
        """Append (ledger, entry, body) records with one write + fsync (runs in a worker thread).

        Returns the index's (key, location) pairs, already packed. Rotates to a new file first
        when the current one is full, so a batch never straddles files.
        """
        if self._offset >= self.max_file_size or (self.direct_io and self._offset % BLOCK):
            self._roll()   # (a file written through the page cache before may end mid-block)
        pack = LOG_RECORD.pack
        crc = record_crc
        key_pack, loc_pack = KEY.pack, LOCATION.pack
        parts, locations = [], []
        append, locate = parts.append, locations.append
        offset, log_id = self._offset, self._current
        for ledger, entry, body in items:
            size = len(body)
            append(pack(size, crc(ledger, entry, body), ledger, entry))
            append(body)
            locate((key_pack(ledger, entry), loc_pack(dir_index, log_id, offset)))
            offset += LOG_HEADER + size
        end = self._offset + padded(offset - self._offset) if self.direct_io else offset
        require_room(self._fd, end - self._offset, str(self.directory))
        try:
            if self.direct_io:
                self._write_direct(parts, self._offset)
            else:
                self._write_buffered(parts)
            os.fsync(self._fd)
        except OSError as exc:
            self._cut_back()
            if not (self.direct_io and exc.errno == errno.EINVAL):
                raise
            # O_DIRECT taken at open but its writes refused (an alignment this file system does
            # not take): write through the page cache from here on, this batch too.
            log.warning("%s: direct writes refused (%s); entry logs are written through the page cache",
                        self.directory, exc)
            self._reopen_buffered()
            return self.append_sorted(items, dir_index)
        self._offset = end
        return locations

    def _reopen_buffered(self) -> None:
        self.direct_io = False
        os.close(self._fd)
        self._fd = self._open_for_append(self.path(self._current))

    def _write_buffered(self, parts: list) -> None:
        for i in range(0, len(parts), _IOV_MAX):
            chunk = parts[i:i + _IOV_MAX]
            n = os.writev(self._fd, chunk)
            want = sum(map(len, chunk))
            if n < want:  # short write: finish the rest the slow way
                view = memoryview(b"".join(chunk))[n:]
                while view:
                    view = view[os.write(self._fd, view):]

    def _write_direct(self, parts: list, at: int) -> None:
        """parts back to back from `at` (a block boundary), through the aligned buffer, the last
        block padded with zeros."""
        if self._buffer is None:
            self._buffer = mmap.mmap(-1, DIRECT_BUFFER)   # anonymous maps are page-aligned
        view = memoryview(self._buffer)
        fill = 0
        for part in parts:
            p = memoryview(part)
            while p:
                n = min(len(p), DIRECT_BUFFER - fill)
                view[fill:fill + n] = p[:n]
                fill += n
                p = p[n:]
                if fill == DIRECT_BUFFER:
                    self._pwrite(view, at)
                    at += fill
                    fill = 0
        if fill:
            end = padded(fill)
            view[fill:end] = bytes(end - fill)
            self._pwrite(view[:end], at)

    def _pwrite(self, data: memoryview, at: int) -> None:
        written = os.pwrite(self._fd, data, at)
        if written < len(data):
            # A direct write cannot go on from an unaligned point: the rest goes through the page
            # cache, where what cut the write short (a full disk, a size limit) raises its own error.
            fd = os.open(self.path(self._current), os.O_WRONLY)
            try:
                rest, at = data[written:], at + written
                while rest:
                    n = os.pwrite(fd, rest, at)
                    rest, at = rest[n:], at + n
            finally:
                os.close(fd)

    def _cut_back(self) -> None:
        """Remove what a failed append left after the last good record (or, if even that
        fails, leave the file and go on in a new one)."""
        try:
            os.ftruncate(self._fd, self._offset)
            os.fsync(self._fd)
        except OSError:
            self._roll()

    def _roll(self) -> None:
        os.close(self._fd)
        self._current += 1
        self._fd = self._open_for_append(self.path(self._current))
        fsync_dir(self.directory)
        self._offset = 0

    def read(self, log_id: int, offset: int, ledger: int, entry: int) -> bytes:
        """The body stored at a location; checks it is the entry the index says (event loop only:
        the descriptors are cached per file)."""
        fd = self._readers.get(log_id)
        if fd is None:
            fd = self._readers[log_id] = os.open(self.path(log_id), os.O_RDONLY)
        return self.read_at(fd, log_id, offset, ledger, entry)

    def read_at(self, fd: int, log_id: int, offset: int, ledger: int, entry: int) -> bytes:
        """Like read, on a descriptor the caller owns (for worker threads)."""
        head = os.pread(fd, LOG_HEADER, offset)
        if len(head) < LOG_HEADER:
            raise EntryLogCorruptError(f"{self.path(log_id)}: no record at offset {offset}")
        length, crc, l, e = LOG_RECORD.unpack(head)
        if (l, e) != (ledger, entry):
            raise EntryLogCorruptError(f"{self.path(log_id)} offset {offset}: holds {l}:{e}, index says {ledger}:{entry}")
        if length > MAX_BODY:
            raise EntryLogCorruptError(f"{self.path(log_id)} offset {offset}: record length {length} is impossible")
        body = os.pread(fd, length, offset + LOG_HEADER)
        if len(body) != length:
            raise EntryLogCorruptError(f"{self.path(log_id)} offset {offset}: record cut short")
        if record_crc(ledger, entry, body) != crc:
            raise EntryLogCorruptError(f"{self.path(log_id)} offset {offset}: entry {ledger}:{entry} fails its "
                                       f"checksum (the file is corrupt there)")
        return body

    def read_run(self, fd: int, log_id: int, ledger: int, first: int, step: int, offsets: Sequence[int],
                 max_bytes: int, checked: bool = True) -> list[bytes | memoryview]:
        """The bodies of entries first, first+step, ... of ledger at these ascending offsets of one
        file, with read_at's checks, read with one pread for the whole span instead of two per
        record (a checkpoint writes a ledger's entries next to each other). Stops once the bodies
        reach max_bytes (at least one is returned). For worker threads, like read_at.

        The record headers of the span are checked all at once (numpy: ids against the index,
        lengths, inside the span); per record only its CRC32C is computed, over ids and body in
        one call, unless not `checked` (the reader checks each entry's digest itself). Bodies
        are views of the span, copied once by whoever packs them. A record that fails any check,
        or lies beyond the span read, is handled by the record-by-record walk (_read_records),
        which reads on or names the corruption."""
        base, last = int(offsets[0]), int(offsets[-1])
        tail = (last - base) // (len(offsets) - 1) if len(offsets) > 1 else 4096
        buf = os.pread(fd, last - base + max(tail, LOG_HEADER), base)
        n = len(offsets)
        rel = np.asarray(offsets, np.int64) - base
        k = int(np.searchsorted(rel, len(buf) - LOG_HEADER, side="right"))  # records whose header was read
        heads = np.frombuffer(buf, np.uint8)[rel[:k, None] + _RECORD_POS].view(_RECORD_DTYPE)[:, 0]
        lengths = heads["length"].astype(np.int64)
        want = np.arange(first, first + k * step, step, dtype=np.int64)
        bad = (heads["ledger"] != np.uint64(ledger)) | (heads["entry"] != want) | (lengths > MAX_BODY) \
            | (rel[:k] + LOG_HEADER + lengths > len(buf))
        m = int(np.argmax(bad)) if bad.any() else k    # records before m are whole in buf, ids as indexed
        sizes = np.cumsum(lengths[:m])
        full = int(np.searchsorted(sizes, max_bytes, side="left")) + 1  # up to the record that reaches max_bytes
        stop = min(m, full)
        starts = (rel[:stop] + LOG_HEADER).tolist()
        ends = (rel[:stop] + LOG_HEADER + lengths[:stop]).tolist()
        if checked:
            value = google_crc32c.value
            for i, (r, end, crc) in enumerate(zip(rel[:stop].tolist(), ends, heads["crc"][:stop].tolist())):
                if value(buf[r + 8:end]) != crc:  # record_crc: ids and body, contiguous
                    raise EntryLogCorruptError(f"{self.path(log_id)} offset {base + r}: entry {ledger}:"
                                               f"{first + i * step} fails its checksum (the file is corrupt there)")
        view = memoryview(buf)
        out: list[bytes | memoryview] = [view[s:e] for s, e in zip(starts, ends)]
        if full <= m or m == n:
            return out
        size = int(sizes[-1]) if m else 0
        rest = [int(o) for o in offsets[m:]]
        return out + self._read_records(fd, log_id, ledger, first + m * step, step, rest, max_bytes - size, buf, base)

    def _read_records(self, fd: int, log_id: int, ledger: int, first: int, step: int, offsets: list[int],
                      max_bytes: int, buf: bytes, base: int) -> list[bytes]:
        """read_run record by record, on buf (read from base), reading on where it ends."""
        out: list[bytes] = []
        size = 0
        unpack, value, extend = LOG_RECORD.unpack_from, google_crc32c.value, google_crc32c.extend
        entry = first
        for offset in offsets:
            rel = offset - base
            if rel + LOG_HEADER > len(buf):
                buf = self._extend(fd, log_id, buf, base, rel + LOG_HEADER)
            length, crc, l, e = unpack(buf, rel)
            if (l, e) != (ledger, entry):
                raise EntryLogCorruptError(f"{self.path(log_id)} offset {offset}: holds {l}:{e}, index says "
                                           f"{ledger}:{entry}")
            if length > MAX_BODY:
                raise EntryLogCorruptError(f"{self.path(log_id)} offset {offset}: record length {length} is impossible")
            end = rel + LOG_HEADER + length
            if end > len(buf):
                buf = self._extend(fd, log_id, buf, base, end)
            body = buf[rel + LOG_HEADER:end]
            if extend(value(buf[rel + 8:rel + LOG_HEADER]), body) != crc:  # record_crc: ids (header bytes 8..24), body
                raise EntryLogCorruptError(f"{self.path(log_id)} offset {offset}: entry {ledger}:{entry} fails its "
                                           f"checksum (the file is corrupt there)")
            out.append(body)
            size += length
            entry += step
            if size >= max_bytes:
                break
        return out

    def _extend(self, fd: int, log_id: int, buf: bytes, base: int, need: int) -> bytes:
        """buf (read from base) read on up to `need` bytes."""
        more = os.pread(fd, need - len(buf), base + len(buf))
        if len(buf) + len(more) < need:
            raise EntryLogCorruptError(f"{self.path(log_id)} offset {base + len(buf)}: record cut short")
        return buf + more

    @property
    def current(self) -> int:
        """The log id new records go to."""
        return self._current

    def remove(self, log_id: int) -> None:
        """Delete a log file nothing in the index points at any more (after compaction)."""
        fd = self._readers.pop(log_id, None)
        if fd is not None:
            os.close(fd)
        self.path(log_id).unlink(missing_ok=True)
        fsync_dir(self.directory)

    def size_bytes(self) -> int:
        return sum(self.path(i).stat().st_size for i in self.log_ids())

    def close(self) -> None:
        for fd in self._readers.values():
            os.close(fd)
        self._readers.clear()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._buffer is not None:
            try:
                self._buffer.close()
            except BufferError:   # a failed write's traceback still holds a view: freed with it
                pass
            self._buffer = None


def scan_log(path: Path) -> Iterator[tuple[int, int, int, bytes]]:
    """(offset, ledger, entry, body) of every record of one entry log file, in order, each
    checked against its CRC (for rebuilding the index); the zeros that pad a direct append to
    its block's end are passed over. Raises EntryLogCorruptError at the first damaged record:
    without a valid length the next record cannot be found. The file is mapped, not read, so
    memory stays bounded."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size:
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                yield from _records(path, data, size)


def _records(path: Path, data, size: int) -> Iterator[tuple[int, int, int, bytes]]:
    pos = 0
    while pos < size:
        block_end = min(size, (pos // BLOCK + 1) * BLOCK)
        if data[pos:pos + LOG_HEADER] == _ZERO_HEADER[:size - pos] and data[pos:block_end] == bytes(block_end - pos):
            pos = block_end   # padding: zeros to the end of the block
            continue
        if size - pos < LOG_HEADER:
            raise EntryLogCorruptError(f"{path} offset {pos}: record header cut short")
        length, crc, ledger, entry = LOG_RECORD.unpack_from(data, pos)
        end = pos + LOG_HEADER + length
        if length > MAX_BODY or end > size:
            raise EntryLogCorruptError(f"{path} offset {pos}: record of {length} bytes runs past the end")
        body = data[pos + LOG_HEADER:end]
        if record_crc(ledger, entry, body) != crc:
            raise EntryLogCorruptError(f"{path} offset {pos}: entry {ledger}:{entry} fails its checksum")
        yield pos, ledger, entry, body
        pos = end
