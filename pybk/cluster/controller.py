"""The cluster controller: desired spec + observed state -> the next safe actions.

Pure: no I/O, no clock, no memory between calls. A platform observes, calls `plan`, carries
out the actions, and calls again later; every step is chosen again from what is observed,
so a restart at any point resumes where the cluster is.

Safety rules (docs/kubernetes.md):
- scale-down drains the highest ordinal first and shrinks only after its decommission is
  DONE; its volumes go only afterwards, and only with pvcPolicy Delete;
- never below the largest ensemble of any open ledger (refused with a condition);
- config/image changes restart one bookie at a time, and only while every bookie is serving
  and nothing is under-replicated;
- without etcd (metadata unknown) nothing is drained or restarted;
- the spec's ledger defaults are stored with the cluster in etcd whenever they differ.
"""
from __future__ import annotations

from .actions import (Action, CancelDecommission, ClearDecommission, DeletePVCs, EnsureResources,
                      RestartBookie, ScaleStatefulSet, SetCondition, StartDecommission,
                      StoreLedgerDefaults, WaitDecommission)
from .observed import DecommissionPhase, Observed, Registration
from .spec import BookieClusterSpec

# Condition reasons (stable strings: users and tests match on them).
INVALID_SPEC = "InvalidSpec"
CREATING = "Creating"
UPDATING_RESOURCES = "UpdatingResources"
SCALING_UP = "ScalingUp"
SCALING_DOWN = "ScalingDown"
BELOW_ENSEMBLE = "BelowLargestOpenEnsemble"
DECOMMISSION_IN_PROGRESS = "DecommissionInProgress"
DECOMMISSION_FAILED = "DecommissionFailed"
ROLLING_RESTART = "RollingRestart"
METADATA_UNAVAILABLE = "MetadataUnavailable"
VOLUMES_IN_USE = "VolumesStillReferenced"
UNDER_REPLICATED = "UnderReplicated"
BOOKIES_NOT_READY = "BookiesNotReady"
READY = "AllBookiesReady"
STABLE = "Stable"
NONE = "NoDecommission"
AS_EXPECTED = "AsExpected"


def plan(spec: BookieClusterSpec, observed: Observed) -> list[Action]:
    """The actions to take now, followed by one SetCondition per condition type."""
    problems = spec.problems()
    if problems:
        msg = "; ".join(problems)
        return [SetCondition("Ready", False, INVALID_SPEC, msg),
                SetCondition("Progressing", False, INVALID_SPEC, "fix the spec to continue"),
                SetCondition("Decommissioning", False, NONE),
                SetCondition("Degraded", True, INVALID_SPEC, msg)]

    if not observed.resources_exist:
        return [EnsureResources(spec.replicas),
                SetCondition("Ready", False, CREATING, f"creating {spec.replicas} bookies"),
                SetCondition("Progressing", True, CREATING, f"creating {spec.replicas} bookies"),
                SetCondition("Decommissioning", False, NONE),
                SetCondition("Degraded", False, AS_EXPECTED)]

    actions: list[Action] = []
    progressing: tuple[str, str] | None = None
    decommissioning: tuple[str, str] | None = None
    degraded: tuple[str, str] | None = None
    meta = observed.metadata
    current = observed.replicas

    if observed.resources_hash != spec.resources_hash():
        actions.append(EnsureResources(spec.replicas))
        progressing = (UPDATING_RESOURCES, "applying the changed spec")

    if meta is not None and meta.ledger_defaults != spec.ledger_defaults:
        actions.append(StoreLedgerDefaults(spec.ledger_defaults))

    # Drained bookies left over from an undone scale-down are put back.
    for o, b in sorted(observed.bookies.items()):
        if o < spec.replicas and b.decommission is not DecommissionPhase.NONE:
            actions.append(CancelDecommission(b.bookie_id, o))

    # Slots already removed: clear their decommission record, drop volumes if asked to -- but
    # never volumes a ledger still needs (a bookie removed without a drain, e.g. by hand).
    kept: list[str] = []
    for o, b in sorted(observed.bookies.items()):
        if o >= current and not b.pod_exists:
            if b.decommission is DecommissionPhase.DONE and o >= spec.replicas:
                actions.append(ClearDecommission(b.bookie_id, o))
            if spec.pvc_policy == "Delete" and b.has_volumes and o >= spec.replicas and meta is not None:
                if b.decommission is DecommissionPhase.DONE or b.in_use is not True:
                    actions.append(DeletePVCs(o))
                else:
                    kept.append(b.bookie_id)

    if spec.replicas > current:
        actions.append(ScaleStatefulSet(spec.replicas))
        progressing = (SCALING_UP, f"scaling up from {current} to {spec.replicas} bookies")
    elif spec.replicas < current:
        progressing, decommissioning, degraded = _scale_down(spec, observed, actions)
    elif meta is not None and progressing is None:
        progressing = _rolling_restart(spec, observed, actions)

    if kept and degraded is None:
        degraded = (VOLUMES_IN_USE, f"keeping the volumes of {', '.join(kept)}: ledgers still reference "
                    "them (removed without a drain?); scale up again so autorecovery can copy them off")
    if meta is None and degraded is None:
        degraded = (METADATA_UNAVAILABLE, "cannot read the metadata service (etcd); "
                    "no bookie is drained or restarted until it answers")
    elif meta is not None and meta.under_replicated and degraded is None:
        degraded = (UNDER_REPLICATED, f"{meta.under_replicated} ledgers are under-replicated; "
                    "autorecovery is re-replicating them")

    ready = observed.ready
    all_ready = (current == spec.replicas and ready == spec.replicas and progressing is None
                 and meta is not None and meta.under_replicated == 0)
    if all_ready:
        ready_cond = SetCondition("Ready", True, READY, f"{ready}/{spec.replicas} bookies ready")
    else:
        reason = progressing[0] if progressing else (degraded[0] if degraded else BOOKIES_NOT_READY)
        ready_cond = SetCondition("Ready", False, reason, f"{ready}/{spec.replicas} bookies ready")
    actions += [
        ready_cond,
        SetCondition("Progressing", progressing is not None,
                     *(progressing or (STABLE, "nothing to change"))),
        SetCondition("Decommissioning", decommissioning is not None,
                     *(decommissioning or (NONE, ""))),
        SetCondition("Degraded", degraded is not None, *(degraded or (AS_EXPECTED, ""))),
    ]
    return actions


def _scale_down(spec: BookieClusterSpec, observed: Observed, actions: list[Action]):
    """One step of draining the highest remaining ordinal; returns the three condition tuples."""
    current = observed.replicas
    meta = observed.metadata
    if meta is None:
        return ((SCALING_DOWN, f"waiting for the metadata service to scale down to {spec.replicas}"),
                None, None)
    if spec.replicas < meta.max_open_ensemble:
        msg = (f"refusing to scale down to {spec.replicas} bookies: an open ledger uses an ensemble "
               f"of {meta.max_open_ensemble}; close those ledgers or keep >= "
               f"{meta.max_open_ensemble} replicas")
        return None, None, (BELOW_ENSEMBLE, msg)
    victim = current - 1
    b = observed.bookie(victim)
    left = f"{current - spec.replicas} bookie(s) to remove, highest ordinal first"
    progressing = (SCALING_DOWN, f"scaling down from {current} to {spec.replicas}: {left}")
    if b is None:
        # Nothing observed at that ordinal (pod never came up): nothing to drain.
        actions.append(ScaleStatefulSet(victim))
        return progressing, None, None
    who = f"bookie {b.bookie_id} (ordinal {victim})"
    phase = b.decommission
    if phase is DecommissionPhase.NONE:
        actions.append(StartDecommission(b.bookie_id, victim))
        return progressing, (DECOMMISSION_IN_PROGRESS, f"{who}: decommission requested"), None
    if phase is DecommissionPhase.IN_PROGRESS:
        actions.append(WaitDecommission(b.bookie_id, victim, b.ledgers_left))
        n = "unknown" if b.ledgers_left is None else str(b.ledgers_left)
        return progressing, (DECOMMISSION_IN_PROGRESS, f"{who}: {n} ledgers left"), None
    if phase is DecommissionPhase.FAILED:
        actions.append(StartDecommission(b.bookie_id, victim, retry=True))
        why = b.decommission_message or "no reason given"
        return (progressing, (DECOMMISSION_FAILED, f"{who}: retrying after failure: {why}"),
                (DECOMMISSION_FAILED, f"decommission of {who} failed: {why}"))
    # DONE: nothing references it any more; remove the slot.
    actions.append(ScaleStatefulSet(victim))
    return progressing, (DECOMMISSION_IN_PROGRESS, f"{who}: drained, removing it"), None


def _rolling_restart(spec: BookieClusterSpec, observed: Observed, actions: list[Action]):
    """Restart the highest stale bookie if the cluster is healthy; else say what we wait for."""
    want = spec.restart_hash()
    members = [observed.bookies[o] for o in sorted(observed.bookies) if o < observed.replicas]
    stale = [b for b in members if b.pod_exists and b.config_hash != want]
    if not stale:
        return None
    meta = observed.metadata
    waiting = [f"bookie {b.bookie_id} not ready" for b in members if not b.serving]
    waiting += [f"bookie {b.bookie_id} not registered" for b in members
                if b.serving and b.registration is Registration.ABSENT]
    if len(members) < observed.replicas:
        waiting.append(f"{observed.replicas - len(members)} bookie(s) not observed yet")
    if meta is not None and meta.under_replicated:
        waiting.append(f"{meta.under_replicated} under-replicated ledgers")
    n = f"{len(stale)} of {observed.replicas} bookies run an old config"
    if waiting:
        return ROLLING_RESTART, f"{n}; waiting: {', '.join(waiting)}"
    victim = stale[-1]
    actions.append(RestartBookie(victim.ordinal, victim.bookie_id))
    return ROLLING_RESTART, f"{n}; restarting bookie {victim.bookie_id} (ordinal {victim.ordinal})"
