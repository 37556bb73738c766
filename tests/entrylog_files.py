"""Reading entry log files as tests damage them (imported by name: tests/ has no packages)."""
from __future__ import annotations

from pathlib import Path

from pybk.bookie.entrylog import BLOCK, LOG_HEADER, LOG_RECORD


def records(path: Path) -> list[tuple[int, int, int, int]]:
    """(ledger, entry, offset, record length) of every record of an entry log, in file order, as
    their headers say (stops at a header cut short; passes over the zeros that pad a direct
    append to its block's end)."""
    data = path.read_bytes()
    out, offset = [], 0
    while offset + LOG_HEADER <= len(data):
        length, crc, ledger, eid = LOG_RECORD.unpack_from(data, offset)
        if (length, crc, ledger, eid) == (0, 0, 0, 0):
            offset = (offset // BLOCK + 1) * BLOCK
            continue
        out.append((ledger, eid, offset, LOG_HEADER + length))
        offset += LOG_HEADER + length
    return out
