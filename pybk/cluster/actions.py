"""The typed steps `plan` asks a platform to take. Each is idempotent on its platform."""
from __future__ import annotations

from dataclasses import dataclass

from pybk.meta.cluster import LedgerDefaults


@dataclass(frozen=True)
class EnsureResources:
    """Create or update everything but the bookie count (k8s: Service, ConfigMap, StatefulSet
    template, PDB, autorecovery, RBAC; local: etcd, config files). `replicas` is used only when
    the bookie set does not exist yet."""
    replicas: int


@dataclass(frozen=True)
class ScaleStatefulSet:
    """Set the number of bookie slots (k8s: StatefulSet replicas; local: start/stop bookies)."""
    replicas: int


@dataclass(frozen=True)
class StartDecommission:
    """Ask for a bookie to be drained (read-only, re-replicate, delete cookie).
    `retry` marks a re-request after a failed attempt."""
    bookie_id: str
    ordinal: int
    retry: bool = False


@dataclass(frozen=True)
class CancelDecommission:
    """Scale-down was undone before it finished: drop the request, make the bookie writable."""
    bookie_id: str
    ordinal: int


@dataclass(frozen=True)
class WaitDecommission:
    """Nothing to do but look again later: a decommission is in progress."""
    bookie_id: str
    ordinal: int
    ledgers_left: int | None


@dataclass(frozen=True)
class ClearDecommission:
    """The drained bookie is gone: remove its finished decommission record."""
    bookie_id: str
    ordinal: int


@dataclass(frozen=True)
class DeletePVCs:
    """Delete a removed bookie's volumes (only with pvcPolicy Delete)."""
    ordinal: int


@dataclass(frozen=True)
class RestartBookie:
    """Restart one bookie with the current config (k8s: delete its pod; OnDelete update)."""
    ordinal: int
    bookie_id: str


@dataclass(frozen=True)
class StoreLedgerDefaults:
    """Store the spec's ledger defaults with the cluster in etcd (the cluster record), where
    clients (Spark writes, `BookKeeper.create_ledger` without an ensemble) find them."""
    defaults: LedgerDefaults


@dataclass(frozen=True)
class SetCondition:
    """Status condition to publish; observedGeneration is added by status.py."""
    type: str
    status: bool
    reason: str
    message: str = ""


Action = (EnsureResources | ScaleStatefulSet | StartDecommission | CancelDecommission
          | WaitDecommission | ClearDecommission | DeletePVCs | RestartBookie | StoreLedgerDefaults
          | SetCondition)

CONDITION_TYPES = ("Ready", "Progressing", "Decommissioning", "Degraded")
