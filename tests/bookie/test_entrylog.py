"""Entry log files written with direct I/O (whole blocks from an aligned buffer, the last one
padded with zeros) and through the page cache: the same records read back, scanned for an index
rebuild and cut back after a failed write, and a file system that refuses O_DIRECT falls back."""
from __future__ import annotations

import errno
import os

import pytest

from pybk.bookie.entrylog import BLOCK, DIRECT_BUFFER, EntryLog, EntryLogCorruptError, scan_log
from pybk.bookie.index import LOCATION

from entrylog_files import records


def body(ledger: int, entry: int, size: int = 1000) -> bytes:
    return (b"%d:%d:" % (ledger, entry)).ljust(size, b"x")


def _read_all(log: EntryLog, locations, expected: dict[tuple[int, int], bytes]) -> None:
    assert len(locations) == len(expected)
    for (ledger, entry), (_, loc) in zip(expected, locations):
        _, log_id, offset = LOCATION.unpack(loc)
        assert log.read(log_id, offset, ledger, entry) == expected[(ledger, entry)]


@pytest.mark.parametrize("direct_io", [True, False])
def test_batches_read_back_and_scan_in_order_in_either_mode(tmp_path, direct_io):
    """Three batches, one of them larger than the direct buffer (a record spans two of its
    writes): every record reads back at its location and an index rebuild's scan finds exactly
    them, in order; direct appends start on a block boundary and pad to one."""
    log = EntryLog(tmp_path, direct_io=direct_io)
    batches = [[(1, e, body(1, e)) for e in range(5)],
               [(2, e, body(2, e, 300_000)) for e in range(DIRECT_BUFFER // 300_000 + 3)],
               [(3, 0, b"")]]
    expected, locations = {}, []
    for items in batches:
        locations += log.append_sorted(items)
        expected.update({(lg, e): b for lg, e, b in items})
        if direct_io:
            assert log.path(log.current).stat().st_size % BLOCK == 0
    _read_all(log, locations, expected)
    log.close()
    scanned = [(lg, e, bytes(b)) for _, lg, e, b in scan_log(log.path(1))]
    assert scanned == [(lg, e, b) for (lg, e), b in expected.items()]
    assert [(lg, e) for lg, e, _, _ in records(log.path(1))] == list(expected)


def test_a_file_written_through_the_page_cache_is_left_for_a_new_one_by_direct_appends(tmp_path):
    """A file that ends mid-block (written by a bookie with direct I/O off) cannot be appended to
    directly: the next direct batch goes to a new file, and both files read back."""
    buffered = EntryLog(tmp_path, direct_io=False)
    first = buffered.append_sorted([(1, 0, body(1, 0, 123))])
    buffered.close()
    assert buffered.path(1).stat().st_size % BLOCK
    direct = EntryLog(tmp_path, direct_io=True)
    second = direct.append_sorted([(2, 0, body(2, 0))])
    assert direct.current == 2
    _read_all(direct, first + second, {(1, 0): body(1, 0, 123), (2, 0): body(2, 0)})
    direct.close()


def test_zeros_that_are_not_padding_to_a_block_end_are_refused_by_the_scan(tmp_path):
    """Only zeros running to the end of their block are padding: a record whose header was
    zeroed in the middle of a block, with data after it in that block, is damage."""
    log = EntryLog(tmp_path, direct_io=True)
    log.append_sorted([(1, e, body(1, e, 100)) for e in range(3)])
    log.close()
    path = log.path(1)
    _, _, offset, _ = records(path)[1]
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(bytes(24))
    with pytest.raises(EntryLogCorruptError):
        list(scan_log(path))


def test_a_file_system_that_refuses_direct_io_is_written_through_the_page_cache(tmp_path, monkeypatch, caplog):
    """O_DIRECT refused with EINVAL (as by a file system without direct I/O): the entry log says
    so once and writes through the page cache; records read back."""
    real_open = os.open

    def refusing_open(path, flags, *args):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)
    monkeypatch.setattr(os, "open", refusing_open)
    log = EntryLog(tmp_path, direct_io=True)
    assert not log.direct_io
    assert "refuses direct I/O" in caplog.text
    locations = log.append_sorted([(1, e, body(1, e, 10)) for e in range(3)])
    _read_all(log, locations, {(1, e): body(1, e, 10) for e in range(3)})
    assert log.path(1).stat().st_size == 3 * (24 + 10)
    log.close()


def test_direct_writes_refused_after_open_go_through_the_page_cache_from_then_on(tmp_path, monkeypatch, caplog):
    """O_DIRECT accepted at open but its writes refused with EINVAL (an alignment the file system
    does not take): the batch is written through the page cache, and so are the next ones."""
    log = EntryLog(tmp_path, direct_io=True)
    first = log.append_sorted([(1, 0, body(1, 0))])

    def refusing_pwrite(fd, data, offset):   # direct writes are pwrites; buffered ones writev
        raise OSError(errno.EINVAL, "Invalid argument")
    monkeypatch.setattr(os, "pwrite", refusing_pwrite)
    second = log.append_sorted([(2, e, body(2, e)) for e in range(3)])
    third = log.append_sorted([(3, 0, body(3, 0))])
    assert not log.direct_io and "direct writes refused" in caplog.text
    _read_all(log, first + second + third, {(1, 0): body(1, 0), **{(2, e): body(2, e) for e in range(3)},
                                            (3, 0): body(3, 0)})
    log.close()
    assert [(lg, e) for _, lg, e, _ in scan_log(log.path(1))] == [(1, 0), (2, 0), (2, 1), (2, 2), (3, 0)]
