"""What a platform saw of a bookie cluster: the input of `plan` besides the spec.

Each platform fills this in from its own world (Kubernetes: StatefulSet, pods, PVCs; local:
child processes and data dirs) plus etcd (registry, decommission progress, under-replication).
Nothing here is remembered between reconciles: an interrupted scale-down resumes because its
state is read back from these observations.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from pybk.meta.cluster import LedgerDefaults


class Registration(str, enum.Enum):
    """Where a bookie is in the etcd registry."""
    WRITABLE = "writable"
    READONLY = "readonly"
    ABSENT = "absent"


class DecommissionPhase(str, enum.Enum):
    """Progress of `/decommission/<bookie id>` as the recovery side reports it."""
    NONE = "none"              # never requested
    IN_PROGRESS = "in_progress"  # read-only, ledgers being re-replicated
    DONE = "done"              # nothing references the bookie, cookie deleted
    FAILED = "failed"          # gave up (message says why); may be retried


@dataclass(frozen=True)
class BookieObservation:
    """One bookie slot (StatefulSet ordinal / local bookie index)."""
    ordinal: int
    bookie_id: str
    pod_exists: bool = True
    pod_ready: bool = True
    pod_terminating: bool = False
    registration: Registration = Registration.WRITABLE
    config_hash: str | None = None      # restart hash the running process was started with
    decommission: DecommissionPhase = DecommissionPhase.NONE
    ledgers_left: int | None = None     # ledgers still referencing it, during a decommission
    decommission_message: str = ""
    has_volumes: bool = True            # PVCs (or local data dirs) exist for this ordinal
    in_use: bool | None = None          # some ledger's ensemble still names it (None: not checked)

    @property
    def serving(self) -> bool:
        """Up, ready and not on its way out."""
        return self.pod_exists and self.pod_ready and not self.pod_terminating


@dataclass(frozen=True)
class MetadataObservation:
    """What etcd said; absent (None in Observed) when etcd could not be read."""
    under_replicated: int = 0
    max_open_ensemble: int = 0          # largest ensemble of any OPEN / IN_RECOVERY ledger
    last_audit: str | None = None       # RFC 3339
    ledger_defaults: LedgerDefaults | None = None  # stored in the cluster record (None: none yet)


@dataclass(frozen=True)
class Observed:
    """Everything `plan` may look at. `bookies` maps ordinal -> observation, and includes
    ordinals beyond the current size that still have volumes (for PVC clean-up)."""
    resources_exist: bool = False       # service, config and StatefulSet (or local equivalents)
    resources_hash: str | None = None   # BookieClusterSpec.resources_hash() they were applied from
    replicas: int = 0                   # current StatefulSet replicas (local: bookie slots)
    bookies: dict[int, BookieObservation] = field(default_factory=dict)
    metadata: MetadataObservation | None = None

    @property
    def ready(self) -> int:
        return sum(1 for o, b in self.bookies.items() if o < self.replicas and b.serving)

    def bookie(self, ordinal: int) -> BookieObservation | None:
        return self.bookies.get(ordinal)
