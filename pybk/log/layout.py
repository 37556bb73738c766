"""A log's metadata in etcd: the keys, the values, and every structural change as a pure function.

    <prefix>lognames/<name>            -> log id (the name's current log; a new id when re-created)
    <prefix>logs/<id>/config           -> LogConfig and the password's check hash (JSON)
    <prefix>logs/<id>/head             -> Head: epoch, writer, state, last segment seq, start offset
    <prefix>logs/<id>/writer           -> the live writer's name, on its session lease
    <prefix>logs/<id>/seg/<20-digit>   -> Segment: ledger, state, first offset, records, bytes, times
    <prefix>logs/<id>/cur/<name>       -> Cursor: the next offset its consumer reads

Nothing grows with the length of the log but the number of `seg/` keys, one per segment. Log ids
come from the ledger id allocator, so an id is never used twice. Segment ledgers carry custom
metadata naming their log, sequence and epoch (LEDGER_*), which is how an orphan (a ledger made
for a segment that was never committed) is told from a live one (`orphan_reason`).
"""
from __future__ import annotations

import base64
import enum
import json
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .options import LogConfig

LEDGER_LOG = "pybk.log.id"
LEDGER_SEQ = "pybk.log.seq"
LEDGER_EPOCH = "pybk.log.epoch"


class LogState(enum.Enum):
    """ACTIVE for a usable log; DELETING once `delete` began (its name is already free)."""

    ACTIVE = "ACTIVE"
    DELETING = "DELETING"


class SegmentState(enum.Enum):
    """OPEN: its writer appends; CLOSED: sealed with its counts; TRUNCATED: its records are deleted
    (the ledger is being or was deleted; the key goes next)."""

    OPEN = "OPEN"
    CLOSED = "CLOSED"
    TRUNCATED = "TRUNCATED"


class Keys:
    """The etcd keys of logs under a metadata prefix."""

    def __init__(self, prefix: bytes):
        self.names = prefix + b"lognames/"
        self.logs = prefix + b"logs/"

    def name(self, name: str) -> bytes:
        return self.names + name.encode()

    def log(self, log_id: int) -> bytes:
        return self.logs + b"%020d/" % log_id

    def config(self, log_id: int) -> bytes:
        return self.log(log_id) + b"config"

    def head(self, log_id: int) -> bytes:
        return self.log(log_id) + b"head"

    def writer(self, log_id: int) -> bytes:
        return self.log(log_id) + b"writer"

    def segments(self, log_id: int) -> bytes:
        return self.log(log_id) + b"seg/"

    def segment(self, log_id: int, seq: int) -> bytes:
        return self.segments(log_id) + b"%020d" % seq

    def cursors(self, log_id: int) -> bytes:
        return self.log(log_id) + b"cur/"

    def cursor(self, log_id: int, name: str) -> bytes:
        return self.cursors(log_id) + name.encode()

    @staticmethod
    def seq_of(key: bytes) -> int:
        return int(key[-20:])


def _dumps(d: dict) -> bytes:
    return json.dumps(d, separators=(",", ":"), sort_keys=True).encode()


@dataclass(frozen=True)
class Head:
    """Who writes the log (epoch: bumped by each writer that opens it) and where it starts."""

    epoch: int = 0
    writer: str = ""
    state: LogState = LogState.ACTIVE
    last_seq: int = -1          # the newest segment's sequence number (-1: none yet)
    start_offset: int = 0       # offsets below were truncated; never moves back
    version: int = 0            # etcd mod_revision it was read at

    def to_bytes(self) -> bytes:
        return _dumps({"epoch": self.epoch, "writer": self.writer, "state": self.state.value,
                       "last_seq": self.last_seq, "start_offset": self.start_offset})

    @classmethod
    def from_bytes(cls, data: bytes, version: int = 0) -> "Head":
        d = json.loads(data)
        return cls(d["epoch"], d["writer"], LogState(d["state"]), d["last_seq"], d["start_offset"], version)


@dataclass(frozen=True)
class Segment:
    """One ledger of the log: records first_offset .. first_offset + records - 1."""

    seq: int
    ledger_id: int
    state: SegmentState
    epoch: int                  # of the writer that opened it
    first_offset: int
    records: int = 0            # known once CLOSED
    bytes: int = 0
    min_ts: int = -1            # timestamps (ms) of its first and last record, once CLOSED (-1: none)
    max_ts: int = -1
    last_entry: int = -1        # the ledger's last entry, once CLOSED
    created_ms: int = 0
    dedup: bytes = b""          # idempotent producers' last sequences: as of its end once CLOSED, of its start while OPEN
    producer: int = 0           # its writer's producer id (0: none, so its entries carry no sequences)
    version: int = 0

    @property
    def end_offset(self) -> int:
        """The offset after its last record (only meaningful once CLOSED)."""
        return self.first_offset + self.records

    def to_bytes(self) -> bytes:
        d = asdict(self)
        del d["version"]
        d["state"] = self.state.value
        d["dedup"] = base64.b64encode(self.dedup).decode()
        return _dumps(d)

    @classmethod
    def from_bytes(cls, data: bytes, version: int = 0) -> "Segment":
        d = json.loads(data)
        d["state"] = SegmentState(d["state"])
        d["dedup"] = base64.b64decode(d.get("dedup", ""))
        return cls(**d, version=version)


@dataclass(frozen=True)
class Cursor:
    """A consumer's durable position: the next offset it reads."""

    name: str
    offset: int
    version: int = 0

    def to_bytes(self) -> bytes:
        return _dumps({"offset": self.offset})

    @classmethod
    def from_bytes(cls, name: str, data: bytes, version: int = 0) -> "Cursor":
        return cls(name, json.loads(data)["offset"], version)


def config_bytes(name: str, config: "LogConfig", password_hash: bytes) -> bytes:
    """The stored `config` value: the log's name, configuration and password check hash."""
    return _dumps({"config": config.to_json(), "password_hash": password_hash.hex(), "name": name})


def config_from_bytes(data: bytes) -> tuple["LogConfig", bytes]:
    from .options import LogConfig
    d = json.loads(data)
    return LogConfig.from_json(d["config"]), bytes.fromhex(d["password_hash"])


# ---- transitions (pure) ---------------------------------------------------------------------

def take_over(head: Head, writer: str) -> Head:
    """A writer opens the log: the next epoch is its own."""
    return replace(head, epoch=head.epoch + 1, writer=writer)


@dataclass(frozen=True)
class SegmentSummary:
    """What a segment's ledger holds, learnt from its entries (at a roll or after recovery)."""

    records: int
    bytes: int
    min_ts: int
    max_ts: int
    last_entry: int


def seal(segment: Segment, summary: SegmentSummary) -> Segment:
    """An OPEN segment becomes CLOSED with what its ledger holds."""
    return replace(segment, state=SegmentState.CLOSED, records=summary.records, bytes=summary.bytes,
                   min_ts=summary.min_ts, max_ts=summary.max_ts, last_entry=summary.last_entry)


def open_next(head: Head, epoch: int, ledger_id: int, first_offset: int, now_ms: int,
              dedup: bytes = b"", producer: int = 0) -> tuple[Head, Segment]:
    """The head and the new OPEN segment after the writer of `epoch` opens segment last_seq + 1."""
    seq = head.last_seq + 1
    return (replace(head, last_seq=seq),
            Segment(seq, ledger_id, SegmentState.OPEN, epoch, first_offset, created_ms=now_ms, dedup=dedup,
                    producer=producer))


class Conflict(enum.Enum):
    """What a writer does when its head CAS loses."""

    RETRY = "retry"     # someone else changed the head (a truncation): same epoch, try again
    FENCED = "fenced"   # a newer writer, or the log is being deleted: stop


def after_head_conflict(head_now: Head | None, epoch: int) -> Conflict:
    """The head changed under a writer of `epoch`: retry only if that epoch still owns the log."""
    if head_now is None or head_now.state is not LogState.ACTIVE or head_now.epoch != epoch:
        return Conflict.FENCED
    return Conflict.RETRY


def truncation_prefix(segments: list[Segment], before: int) -> list[Segment]:
    """The segments `truncate(before)` deletes: the longest prefix of segments already TRUNCATED
    (an earlier truncation that stopped half-way) or CLOSED with every record below `before`.
    Stops at the first OPEN one."""
    out = []
    for s in segments:
        if s.state is SegmentState.OPEN or (s.state is SegmentState.CLOSED and s.end_offset > before):
            break
        out.append(s)
    return out


def ledger_custom(log_id: int, seq: int, epoch: int) -> dict[str, bytes]:
    """The custom metadata of a segment's ledger: which log, sequence and writer epoch it is for."""
    return {LEDGER_LOG: b"%d" % log_id, LEDGER_SEQ: b"%d" % seq, LEDGER_EPOCH: b"%d" % epoch}


def ledger_owner(custom: dict[str, bytes]) -> tuple[int, int, int] | None:
    """(log id, seq, epoch) from a ledger's custom metadata; None for a ledger of no log."""
    try:
        return int(custom[LEDGER_LOG]), int(custom[LEDGER_SEQ]), int(custom[LEDGER_EPOCH])
    except (KeyError, ValueError):
        return None


def orphan_reason(ledger_id: int, seq: int, epoch: int, head: Head | None,
                  segment: Segment | None) -> str:
    """Why a ledger made for segment `seq` of a log by a writer of `epoch` is an orphan, "" if it is
    not (or may not be yet). `head` is the log's (None: the log is gone), `segment` the stored
    segment `seq` (None: there is none)."""
    if head is None:
        return "its log no longer exists"
    if head.state is LogState.DELETING:
        return "its log is being deleted"
    if segment is not None:
        if segment.ledger_id == ledger_id:
            return "its segment was truncated" if segment.state is SegmentState.TRUNCATED else ""
        return f"segment {seq} was committed with ledger {segment.ledger_id}"
    if seq <= head.last_seq:
        return f"segment {seq} was never committed with it (the log's last segment is {head.last_seq})"
    if epoch < head.epoch:
        return f"its writer (epoch {epoch}) was fenced by epoch {head.epoch} before committing it"
    return ""   # a live writer's next segment, made ahead of its roll
