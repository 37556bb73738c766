"""What a platform saw of a BookieLog's world: the input of `plan` besides the spec.

Filled in from Kubernetes (the BookieCluster, the password Secret, other BookieLogs) or the local
platform, plus etcd and the bookies (the log itself). Nothing is remembered between reconciles
but `managed_id`, which the platform keeps in the resource's status.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

from pybk.log import CursorInfo, LogConfig, Segment, SegmentState


class ClusterState(str, enum.Enum):
    """The BookieCluster the log names."""
    PRESENT = "present"
    DELETING = "deleting"       # deletionTimestamp set: still usable to delete the log with
    ABSENT = "absent"


class SecretState(str, enum.Enum):
    """The Secret holding the log's password."""
    PRESENT = "present"
    ABSENT = "absent"
    KEY_MISSING = "key_missing"


@dataclass(frozen=True)
class Replication:
    """Ensemble, write quorum and ack quorum of a ledger."""
    ensemble: int
    write_quorum: int
    ack_quorum: int

    @classmethod
    def of(cls, config: LogConfig) -> "Replication":
        return cls(config.ensemble, config.write_quorum, config.ack_quorum)

    def __str__(self) -> str:
        return f"ensemble {self.ensemble}, write quorum {self.write_quorum}, ack quorum {self.ack_quorum}"


@dataclass(frozen=True)
class LogObservation:
    """The log the name resolves to, as etcd and the bookies describe it."""
    log_id: int
    config: LogConfig
    password_matches: bool          # the Secret's password is this log's
    epoch: int = 0
    writer: str | None = None       # the live writer's name (None: nobody has it open)
    start_offset: int = 0
    end_offset: int = 0
    segments: tuple[Segment, ...] = ()
    cursors: tuple[CursorInfo, ...] = ()
    open_replication: Replication | None = None   # what the OPEN segment's ledger was made with

    @property
    def bytes(self) -> int:
        """Bytes of records in closed segments (an open segment's are known only once it closes)."""
        return sum(s.bytes for s in self.segments if s.state is SegmentState.CLOSED)


@dataclass(frozen=True)
class Observed:
    """Everything `plan` may look at."""
    cluster: ClusterState = ClusterState.PRESENT
    secret: SecretState = SecretState.PRESENT
    metadata_error: str | None = None   # why etcd or the bookies could not be read (None: they could)
    log: LogObservation | None = None   # None: no log of that name
    managed_id: int | None = None       # the id this resource created or adopted (from its status)
    claimed_by: str | None = None       # another BookieLog of the same cluster naming the same log
    now_ms: int = 0
