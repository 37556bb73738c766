"""Rebuilding a stopped bookie's LMDB index from its entry logs and journal (`pybk bookie
--rebuild-index`), for an index that is lost or damaged."""
from __future__ import annotations

import os
import time
from pathlib import Path

from .entrylog import EntryLogCorruptError, scan_log
from .index import KEY, LOCATION, Index, index_dir
from .journal import JournalCorruptError, JournalGapError, RecordType, journal_files, read_head, read_mark, scan_file
from .state import STATE_RECORDS, LedgerState, apply_record
from .storage import lock_dirs

_ADD = int(RecordType.ADD)


def rebuild_index(journal_dir: Path, ledger_dirs: list[Path], master_keys: dict[int, bytes] | None = None
                  ) -> dict:
    """Rebuild the LMDB index of a stopped bookie from its entry logs and journal; the old index
    directory is renamed aside, not deleted. Returns a summary.

    Every entry log record whose CRC holds is indexed (a later copy of an entry wins, as in the
    index). Ledger state is rebuilt as far as the files allow: the LAC from the entry headers and
    from the journal's LAC records; master keys from the journal's MASTER_KEY records, else from
    `master_keys` (the keys earlier releases stored in ledger metadata), else empty (the next key
    a writer or reader sends is checked against the ledger's key check in the metadata). Every
    ledger is marked fenced: whether it was fenced went with the index, and a fenced ledger is the
    safe answer (its writer, which this bookie's outage already sent elsewhere, gets FENCED; reads
    and recovery work). Entries of ledgers deleted but not yet compacted away come back until the
    next garbage collection removes them again. Entries after the journal mark are not in the
    entry logs: the next start replays them from the journal, as always. DirsInUseError while the
    bookie runs."""
    lock = lock_dirs(Path(journal_dir))
    try:
        return _rebuild_index(Path(journal_dir), ledger_dirs, master_keys or {})
    finally:
        os.close(lock)


def _rebuild_index(journal_dir: Path, ledger_dirs: list[Path], master_keys: dict[int, bytes]) -> dict:
    """rebuild_index with the dirs locked."""
    idir = index_dir(ledger_dirs[0])
    aside = None
    if idir.exists():
        aside = idir.with_name(f"index.broken-{time.strftime('%Y%m%dT%H%M%S')}")
        os.replace(idir, aside)
    index = Index(ledger_dirs[0])
    states: dict[int, LedgerState] = {}
    damaged: list[str] = []
    entries = 0
    try:
        for d, ledger_dir in enumerate(ledger_dirs):
            for path in sorted((Path(ledger_dir) / "entrylogs").glob("entrylog-*.log")):
                log_id = int(path.stem.split("-", 1)[1], 16)
                batch: list[tuple[bytes, bytes]] = []
                try:
                    for offset, ledger, eid, body in scan_log(path):
                        batch.append((KEY.pack(ledger, eid), LOCATION.pack(d, log_id, offset)))
                        st = states.get(ledger) or states.setdefault(ledger, LedgerState(fenced=True))
                        apply_record(st, _ADD, eid, body)
                        if len(batch) >= 10_000:
                            index.commit(batch, [])
                            entries += len(batch)
                            batch = []
                except EntryLogCorruptError as exc:
                    damaged.append(str(exc))
                index.commit(batch, [])
                entries += len(batch)
        for _, path in journal_files(journal_dir):
            try:
                for rtype, ledger, eid, body in scan_file(path, 0, is_last=False):
                    if rtype not in STATE_RECORDS:
                        continue
                    st = states.get(ledger) or states.setdefault(ledger, LedgerState(fenced=True))
                    apply_record(st, rtype, eid, body)
            except (JournalCorruptError, JournalGapError) as exc:
                damaged.append(str(exc).splitlines()[0])
        missing_keys = 0
        for ledger, st in states.items():
            if not st.master_key:
                st.master_key = master_keys.get(ledger, b"")
                missing_keys += not st.master_key
        mark = read_mark(journal_dir)
        index.commit([], [(ledger, st.to_bytes()) for ledger, st in states.items()], mark)
        journal_id = read_head(journal_dir).journal_id
        if journal_id:
            index.bind_journal(journal_id)
    finally:
        index.close()
    return {"index": str(idir / "data.mdb"), "old_index": str(aside) if aside else None, "entries": entries,
            "ledgers": len(states), "ledgers_without_master_key": missing_keys, "damaged": damaged,
            "journal_mark": tuple(mark)}
