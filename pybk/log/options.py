"""What a log is configured with (stored once in etcd: `LogConfig`) and what a writer or reader
process chooses for itself (`WriterOptions`, client-side only)."""
from __future__ import annotations

import enum
import os
import re
import socket
from dataclasses import asdict, dataclass, field

from pybk.client import quorum
from pybk.entry import DigestType

from .errors import InvalidLogConfigError

MiB = 1 << 20
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$")


def check_name(name: str) -> str:
    """A log name: 1-200 characters of letters, digits, `.`, `_`, `-` and `/`, starting with a
    letter or digit (it becomes part of an etcd key)."""
    if not isinstance(name, str) or not NAME_RE.match(name) or "//" in name:
        raise InvalidLogConfigError(f"bad log name {name!r}: use 1-200 letters, digits, '.', '_', '-' or '/', "
                                    f"starting with a letter or digit")
    return name


class RetentionPolicy(enum.Enum):
    """NONE keeps everything until `truncate`; LIMITS deletes the oldest closed segments past an age
    or a size; INTEREST never deletes records at or above the lowest durable cursor."""

    NONE = "none"
    LIMITS = "limits"
    INTEREST = "interest"


@dataclass(frozen=True)
class Rollover:
    """When the writer closes its segment and opens the next one (None: no limit of that kind).
    A roll happens at whichever comes first."""

    max_bytes: int | None = 256 * MiB
    max_records: int | None = None
    max_age: float | None = 4 * 3600.0      # seconds since the segment was opened
    max_idle: float | None = 3600.0         # seconds without an append (only a segment holding records)


@dataclass(frozen=True)
class Retention:
    """What retention may delete (always whole closed segments, always a prefix of the log)."""

    policy: RetentionPolicy = RetentionPolicy.NONE
    max_age: float | None = None            # LIMITS: delete segments whose newest record is older (seconds)
    max_bytes: int | None = None            # LIMITS: keep at most this many bytes of closed segments
    max_backlog_bytes: int | None = None    # INTEREST: past this, delete even what a cursor still needs


@dataclass(frozen=True)
class LogConfig:
    """A log's stored configuration: replication of its segment ledgers, digest, rollover and
    retention. The password is not here: only its one-way hash is stored (`password_hash`)."""

    ensemble: int = 3
    write_quorum: int = 3
    ack_quorum: int = 2
    digest: DigestType = DigestType.CRC32C
    rollover: Rollover = field(default_factory=Rollover)
    retention: Retention = field(default_factory=Retention)

    def validate(self) -> "LogConfig":
        try:
            quorum.validate(self.ensemble, self.write_quorum, self.ack_quorum)
        except ValueError as e:
            raise InvalidLogConfigError(f"bad log replication: {e}") from None
        for what, v in asdict(self.rollover).items():
            if v is not None and v <= 0:
                raise InvalidLogConfigError(f"rollover {what} must be positive or None, got {v!r}")
        r = self.retention
        if not isinstance(r.policy, RetentionPolicy):
            raise InvalidLogConfigError(f"retention policy must be a RetentionPolicy, got {r.policy!r}")
        for what in ("max_age", "max_bytes", "max_backlog_bytes"):
            v = getattr(r, what)
            if v is not None and v < 0:
                raise InvalidLogConfigError(f"retention {what} must be >= 0 or None, got {v!r}")
        return self

    def to_json(self) -> dict:
        return {"ensemble": self.ensemble, "write_quorum": self.write_quorum, "ack_quorum": self.ack_quorum,
                "digest": self.digest.value, "rollover": asdict(self.rollover),
                "retention": {**asdict(self.retention), "policy": self.retention.policy.value}}

    @classmethod
    def from_json(cls, d: dict) -> "LogConfig":
        ret = dict(d.get("retention", {}))
        ret["policy"] = RetentionPolicy(ret.get("policy", "none"))
        return cls(ensemble=int(d["ensemble"]), write_quorum=int(d["write_quorum"]),
                   ack_quorum=int(d["ack_quorum"]), digest=DigestType(d.get("digest", "CRC32C")),
                   rollover=Rollover(**d.get("rollover", {})), retention=Retention(**ret))


def default_writer_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class WriterOptions:
    """A writer's own choices (not stored): batching, and idempotence. `producer_id` (a positive
    64-bit number the application keeps across restarts) turns on deduplication: each record is
    stamped with the producer's next sequence number (or the `sequence=` given to append), and a
    sequence already stored is not stored again."""

    batch_bytes: int = 64 * 1024        # send an entry once its records reach this size
    linger: float = 0.001               # or this long after its first record (if that came linger/2 or more
                                        # after the previous record: at once, or at the next acknowledgement
                                        # while an entry is unacknowledged; 0: always at once)
    producer_id: int | None = None
    max_producers: int = 1000           # producers whose last sequence is remembered (least recent dropped)
    producer_idle: float = 6 * 3600.0   # forget a producer whose last record is older (seconds)
    dedup_window: int = 64              # entries per producer whose offsets a duplicate can be answered with
    name: str = field(default_factory=default_writer_name)   # shown in the log's head as its writer

    def validate(self) -> "WriterOptions":
        if self.batch_bytes <= 0 or self.linger < 0:
            raise InvalidLogConfigError("batch_bytes must be positive and linger >= 0")
        if self.producer_id is not None and not 0 < self.producer_id < (1 << 64):
            raise InvalidLogConfigError(f"producer_id must be a positive 64-bit number, got {self.producer_id!r}")
        if self.max_producers <= 0 or self.producer_idle <= 0 or self.dedup_window <= 0:
            raise InvalidLogConfigError("max_producers, producer_idle and dedup_window must be positive")
        return self
