"""The BookieLog controller: spec + observed -> the next actions, and the Ready condition.

Pure: no I/O, no clock (the time comes in `Observed.now_ms`), no memory but the managed id the
platform keeps in status. Rules (docs/kubernetes.md#bookielog-named-logs-as-resources):
- only the log this resource created or adopted (`managed_id`) is ever changed or deleted;
- an existing log is adopted only if the Secret holds its password and its configuration equals
  the spec; otherwise nothing is changed and Ready says why (ConfigConflict, PasswordMismatch);
- a changed spec is stored (retention applies at once; replication and rollover to writers
  opened afterwards, and Ready says so while the open segment has the old replication);
- retention truncates what `pybk.log.retention.retention_before` allows;
- deletion follows deletionPolicy: Retain keeps the log, Delete deletes it (waiting while a
  writer has it open), never a log that is not this resource's.
"""
from __future__ import annotations

import enum
from dataclasses import asdict

from pybk.log import LogConfig
from pybk.log.retention import retention_before

from .actions import Action, AdoptLog, CreateLog, DeleteLog, ReconfigureLog, SetCondition, TruncateLog
from .observed import ClusterState, Observed, Replication, SecretState
from .spec import BookieLogSpec, DeletionPolicy


class Reason(str, enum.Enum):
    """Reasons of the Ready condition (stable strings: users and tests match on them)."""
    READY = "Ready"
    REPLICATION_PENDING = "ReplicationPending"
    CREATING = "Creating"
    INVALID_SPEC = "InvalidSpec"
    CLUSTER_NOT_FOUND = "ClusterNotFound"
    CLUSTER_DELETING = "ClusterDeleting"
    SECRET_NOT_FOUND = "SecretNotFound"
    SECRET_KEY_MISSING = "SecretKeyMissing"
    METADATA_UNAVAILABLE = "MetadataUnavailable"
    PASSWORD_MISMATCH = "PasswordMismatch"
    CONFIG_CONFLICT = "ConfigConflict"
    DIGEST_IMMUTABLE = "DigestImmutable"
    NAME_CLAIMED = "NameClaimed"
    LOG_REPLACED = "LogReplaced"
    RECONCILE_FAILED = "ReconcileFailed"
    DELETING = "Deleting"
    LOG_IN_USE = "LogInUse"


# Reasons that need a person to change something: the platform does not retry them faster than
# its refresh interval (no hot loop), and logs them once per look.
NEEDS_A_PERSON = frozenset({Reason.INVALID_SPEC, Reason.CLUSTER_NOT_FOUND, Reason.SECRET_NOT_FOUND,
                            Reason.SECRET_KEY_MISSING, Reason.PASSWORD_MISMATCH, Reason.CONFIG_CONFLICT,
                            Reason.DIGEST_IMMUTABLE, Reason.NAME_CLAIMED, Reason.LOG_REPLACED})


def ready(status: bool, reason: Reason, message: str) -> SetCondition:
    return SetCondition("Ready", status, reason.value, message)


def config_changes(old: LogConfig, new: LogConfig) -> tuple[str, ...]:
    """What differs between two configurations, as `field: old -> new` (the spec's field names)."""
    out = []
    names = {"ensemble": "replication.ensemble", "write_quorum": "replication.writeQuorum",
             "ack_quorum": "replication.ackQuorum", "digest": "digest"}
    for attr, label in names.items():
        a, b = getattr(old, attr), getattr(new, attr)
        if a != b:
            out.append(f"{label}: {getattr(a, 'value', a)} -> {getattr(b, 'value', b)}")
    for group in ("rollover", "retention"):
        a, b = asdict(getattr(old, group)), asdict(getattr(new, group))
        for k in a:
            if a[k] != b[k]:
                show = (lambda v: getattr(v, "value", v))
                out.append(f"{group}.{_camel(k)}: {show(a[k])} -> {show(b[k])}")
    return tuple(out)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w.title() for w in rest)


def _precheck(spec: BookieLogSpec, observed: Observed) -> SetCondition | None:
    """The reasons nothing can be done at all, in the order a person would fix them."""
    if spec.errors:
        return ready(False, Reason.INVALID_SPEC, "; ".join(spec.errors))
    if observed.cluster is ClusterState.ABSENT:
        return ready(False, Reason.CLUSTER_NOT_FOUND,
                     f"BookieCluster {spec.cluster!r} does not exist in namespace {spec.namespace!r}")
    if observed.cluster is ClusterState.DELETING:
        return ready(False, Reason.CLUSTER_DELETING, f"BookieCluster {spec.cluster!r} is being deleted")
    ref = spec.password_secret
    if observed.secret is SecretState.ABSENT:
        return ready(False, Reason.SECRET_NOT_FOUND,
                     f"Secret {ref.name!r} (the log's password, key {ref.key!r}) does not exist in namespace "
                     f"{spec.namespace!r}: kubectl create secret generic {ref.name} --from-literal={ref.key}=...")
    if observed.secret is SecretState.KEY_MISSING:
        return ready(False, Reason.SECRET_KEY_MISSING,
                     f"Secret {ref.name!r} has no key {ref.key!r} (set spec.passwordSecretRef.key to the key "
                     f"holding the log's password)")
    if observed.metadata_error is not None:
        return ready(False, Reason.METADATA_UNAVAILABLE,
                     f"cannot read the log from cluster {spec.cluster!r}: {observed.metadata_error}")
    return None


def plan(spec: BookieLogSpec, observed: Observed) -> list[Action]:
    """The actions to take now, ending with the Ready condition."""
    blocked = _precheck(spec, observed)
    if blocked is not None:
        return [blocked]
    log, managed = observed.log, observed.managed_id
    if observed.claimed_by and managed is None:
        return [ready(False, Reason.NAME_CLAIMED,
                      f"log {spec.log!r} on cluster {spec.cluster!r} is managed by BookieLog "
                      f"{observed.claimed_by!r}: give this one another spec.logName")]
    if log is None:
        why = (f"log {spec.log!r} (id {managed}) was deleted outside Kubernetes: creating it again, empty"
               if managed is not None else f"creating log {spec.log!r} on cluster {spec.cluster!r}")
        return [CreateLog(spec.config), ready(False, Reason.CREATING, why)]
    if managed is not None and managed != log.log_id:
        return [ready(False, Reason.LOG_REPLACED,
                      f"log {spec.log!r} is now id {log.log_id}, not id {managed} which this resource manages: it "
                      f"was deleted and created again outside Kubernetes, so it is left alone; delete this "
                      f"resource, or recreate it to adopt the new log")]
    if not log.password_matches:
        whose = "this resource's log" if managed is not None else "the existing log (created outside Kubernetes)"
        return [ready(False, Reason.PASSWORD_MISMATCH,
                      f"Secret {spec.password_secret.name!r} does not hold the password of {whose} "
                      f"{spec.log!r}; nothing is changed")]
    actions: list[Action] = []
    if managed is None:
        changes = config_changes(log.config, spec.config)
        if changes:
            return [ready(False, Reason.CONFIG_CONFLICT,
                          f"log {spec.log!r} exists (created outside Kubernetes, id {log.log_id}) with another "
                          f"configuration; it is adopted only when the spec equals it, then changed through the "
                          f"spec. Differences (log -> spec): {'; '.join(changes)}")]
        actions.append(AdoptLog(log.log_id))
    elif log.config.digest is not spec.config.digest:
        return [ready(False, Reason.DIGEST_IMMUTABLE,
                      f"log {spec.log!r} has digest {log.config.digest.value}: its segments are written with it, "
                      f"so it cannot become {spec.config.digest.value}")]
    else:
        changes = config_changes(log.config, spec.config)
        if changes:
            actions.append(ReconfigureLog(spec.config, changes))
    before = retention_before(spec.config.retention, log.segments, observed.now_ms,
                              [c.offset for c in log.cursors])
    if before is not None:
        actions.append(TruncateLog(before))
    want = Replication.of(spec.config)
    summary = (f"log {spec.log!r} (id {log.log_id}): offsets {log.start_offset}..{log.end_offset} in "
               f"{len(log.segments)} segment(s)")
    if log.open_replication is not None and log.open_replication != want:
        holder = (f"its writer {log.writer!r} keeps its configuration until it reopens"
                  if log.writer else "the next writer to open it makes its segments with it")
        actions.append(ready(True, Reason.REPLICATION_PENDING,
                             f"{summary}; the open segment has {log.open_replication}; the spec's {want} applies "
                             f"to segments made by writers opened from now on ({holder})"))
    else:
        actions.append(ready(True, Reason.READY, summary))
    return actions


def plan_delete(spec: BookieLogSpec, observed: Observed) -> tuple[list[Action], SetCondition | None]:
    """What deleting the resource does: (actions, None) when the resource may go once they are
    done, or ([], condition) while it must wait (the condition says for what)."""
    log, managed = observed.log, observed.managed_id
    if spec.deletion_policy is DeletionPolicy.RETAIN or managed is None:
        return [], None
    if observed.cluster is ClusterState.ABSENT:
        return [], None     # nowhere to delete it from: the data stays with whatever is left of the cluster
    if observed.metadata_error is not None:
        return [], ready(False, Reason.METADATA_UNAVAILABLE,
                         f"deleting log {spec.log!r} (deletionPolicy Delete) waits for cluster {spec.cluster!r}: "
                         f"{observed.metadata_error}")
    if log is None or log.log_id != managed:
        return [], None     # gone already, or the name is another log now: not this resource's to delete
    if log.writer is not None:
        return [], ready(False, Reason.LOG_IN_USE,
                         f"deleting log {spec.log!r} (deletionPolicy Delete) waits for its writer {log.writer!r} "
                         f"to close it")
    force = observed.secret is not SecretState.PRESENT or not log.password_matches
    return [DeleteLog(log.log_id, force=force)], None


def deletion_note(spec: BookieLogSpec, observed: Observed) -> str:
    """What happened to the log when the resource went (for the operator's log)."""
    if spec.deletion_policy is DeletionPolicy.RETAIN:
        return f"log {spec.log!r} is retained (deletionPolicy Retain)"
    if observed.managed_id is None:
        return f"log {spec.log!r} is retained: this resource never created or adopted it"
    if observed.cluster is ClusterState.ABSENT:
        return f"log {spec.log!r} is retained: BookieCluster {spec.cluster!r} no longer exists"
    if observed.log is None or observed.log.log_id != observed.managed_id:
        return f"log {spec.log!r} (id {observed.managed_id}) was already gone"
    return f"log {spec.log!r} (id {observed.managed_id}) deleted (deletionPolicy Delete)"
