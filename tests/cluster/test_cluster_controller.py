"""The controller's plan for every scenario of a cluster's life (pure: no I/O)."""
from __future__ import annotations

import dataclasses

from pybk.cluster import controller as c
from pybk.cluster.actions import (CancelDecommission, ClearDecommission, DeletePVCs, EnsureResources,
                                  RestartBookie, ScaleStatefulSet, SetCondition, StartDecommission,
                                  StoreLedgerDefaults, WaitDecommission)
from pybk.cluster.observed import (BookieObservation, DecommissionPhase as P, MetadataObservation,
                                   Observed, Registration)
from pybk.cluster.spec import BookieClusterSpec
from pybk.cluster.status import conditions, status


def spec(replicas=3, **extra) -> BookieClusterSpec:
    return BookieClusterSpec.from_manifest({"apiVersion": "pybk.io/v1alpha1", "kind": "BookieCluster",
                                            "metadata": {"name": "bk", "generation": 7},
                                            "spec": {"replicas": replicas, **extra}}, validate=False)


def bid(o: int) -> str:
    return f"bk-{o}.bk.default.svc:3181"


def observed(s: BookieClusterSpec, replicas: int, *, phases=None, gone=(), hashes=None, ready=None,
             under=0, ensemble=3, meta=True, extra_volumes=(), defaults="spec") -> Observed:
    """A cluster of `replicas` healthy bookies running spec `s`, with the given differences."""
    phases, hashes = phases or {}, hashes or {}
    bookies = {}
    for o in list(range(replicas)) + list(extra_volumes):
        exists = o < replicas and o not in gone
        bookies[o] = BookieObservation(
            ordinal=o, bookie_id=bid(o), pod_exists=exists,
            pod_ready=exists and (ready is None or o in ready),
            registration=(Registration.READONLY if phases.get(o, P.NONE) is not P.NONE
                          else Registration.WRITABLE) if exists else Registration.ABSENT,
            config_hash=hashes.get(o, s.restart_hash()), decommission=phases.get(o, P.NONE),
            ledgers_left=5 if phases.get(o) is P.IN_PROGRESS else None,
            decommission_message="not enough bookies" if phases.get(o) is P.FAILED else "")
    return Observed(resources_exist=True, resources_hash=s.resources_hash(), replicas=replicas,
                    bookies=bookies,
                    metadata=MetadataObservation(under_replicated=under, max_open_ensemble=ensemble,
                                                 ledger_defaults=s.ledger_defaults if defaults == "spec" else defaults)
                    if meta else None)


def steps(actions):
    return [a for a in actions if not isinstance(a, SetCondition)]


def cond(actions, type_):
    return next(a for a in actions if isinstance(a, SetCondition) and a.type == type_)


def test_create_ensures_resources_and_reports_creating():
    s = spec(3)
    actions = c.plan(s, Observed())
    assert steps(actions) == [EnsureResources(3)]
    assert cond(actions, "Progressing").reason == c.CREATING and not cond(actions, "Ready").status


def test_ledger_defaults_missing_or_changed_in_etcd_are_stored_without_disturbing_the_bookies():
    from pybk.meta.cluster import LedgerDefaults
    s = spec(3, ledgerDefaults={"ensemble": 2, "writeQuorum": 2, "ackQuorum": 1})
    for stored in (None, LedgerDefaults(3, 3, 2)):
        actions = c.plan(s, observed(s, 3, defaults=stored))
        assert steps(actions) == [StoreLedgerDefaults(LedgerDefaults(2, 2, 1))]
        assert cond(actions, "Ready").status and not cond(actions, "Progressing").status
    assert steps(c.plan(s, observed(s, 3))) == []
    assert steps(c.plan(s, observed(s, 3, meta=False))) == []  # etcd unknown: nothing to store


def test_steady_cluster_does_nothing_and_is_ready():
    s = spec(3)
    actions = c.plan(s, observed(s, 3))
    assert steps(actions) == []
    assert cond(actions, "Ready").status and not cond(actions, "Progressing").status
    assert [a.type for a in actions] == ["Ready", "Progressing", "Decommissioning", "Degraded"]


def test_changed_spec_reapplies_resources():
    s = spec(3)
    o = dataclasses.replace(observed(s, 3), resources_hash="old")
    assert EnsureResources(3) in c.plan(s, o)


def test_scale_up_raises_replicas():
    s = spec(5)
    actions = c.plan(s, observed(s, 3))
    assert steps(actions) == [ScaleStatefulSet(5)]
    assert cond(actions, "Progressing").reason == c.SCALING_UP


def test_scale_down_starts_decommission_of_highest_ordinal_only():
    s = spec(3)
    actions = c.plan(s, observed(s, 5))
    assert steps(actions) == [StartDecommission(bid(4), 4)]
    d = cond(actions, "Decommissioning")
    assert d.status and bid(4) in d.message


def test_scale_down_waits_while_decommission_in_progress():
    s = spec(3)
    actions = c.plan(s, observed(s, 5, phases={4: P.IN_PROGRESS}))
    assert steps(actions) == [WaitDecommission(bid(4), 4, 5)]
    d = cond(actions, "Decommissioning")
    assert d.status and d.reason == c.DECOMMISSION_IN_PROGRESS and "5 ledgers left" in d.message
    assert not any(isinstance(a, ScaleStatefulSet) for a in actions)


def test_scale_down_shrinks_only_after_decommission_finished():
    s = spec(3)
    actions = c.plan(s, observed(s, 5, phases={4: P.DONE}))
    assert steps(actions) == [ScaleStatefulSet(4)]


def test_failed_decommission_is_reported_and_retried_without_shrinking():
    s = spec(3)
    actions = c.plan(s, observed(s, 5, phases={4: P.FAILED}))
    assert steps(actions) == [StartDecommission(bid(4), 4, retry=True)]
    deg = cond(actions, "Degraded")
    assert deg.status and deg.reason == c.DECOMMISSION_FAILED and "not enough bookies" in deg.message


def test_removed_bookie_volumes_deleted_only_with_delete_policy():
    retain = spec(3)
    o = observed(retain, 4, gone=(), phases={4: P.DONE}, extra_volumes=(4,))
    assert DeletePVCs(4) not in c.plan(retain, o)
    assert ClearDecommission(bid(4), 4) in c.plan(retain, o)
    delete = spec(3, pvcPolicy="Delete")
    o = observed(delete, 4, phases={4: P.DONE}, extra_volumes=(4,))
    acts = steps(c.plan(delete, o))
    assert DeletePVCs(4) in acts and StartDecommission(bid(3), 3) in acts


def test_volumes_of_a_bookie_still_running_are_never_deleted():
    s = spec(3, pvcPolicy="Delete")
    for phase in P:
        acts = c.plan(s, observed(s, 5, phases={4: phase}))
        assert not any(isinstance(a, DeletePVCs) for a in acts)


def test_refuses_to_go_below_largest_open_ensemble():
    s = spec(3, ledgerDefaults={"ensemble": 3, "writeQuorum": 3, "ackQuorum": 2})
    actions = c.plan(s, observed(s, 5, ensemble=4))
    assert steps(actions) == []
    deg = cond(actions, "Degraded")
    assert deg.status and deg.reason == c.BELOW_ENSEMBLE and "ensemble of 4" in deg.message


def test_scale_down_waits_for_metadata_service():
    s = spec(3)
    actions = c.plan(s, observed(s, 5, meta=False))
    assert steps(actions) == []
    assert cond(actions, "Degraded").reason == c.METADATA_UNAVAILABLE


def test_operator_restart_mid_scale_down_resumes_from_observed_state():
    # 5 -> 3 was interrupted after bookie 4 was drained and removed (volumes kept, Delete policy),
    # so a fresh operator must delete 4's volumes and start on bookie 3 -- never touch 0..2.
    s = spec(3, pvcPolicy="Delete")
    o = observed(s, 4, phases={4: P.DONE}, extra_volumes=(4,))
    acts = steps(c.plan(s, o))
    assert set(acts) == {ClearDecommission(bid(4), 4), DeletePVCs(4), StartDecommission(bid(3), 3)}
    # ... and interrupted while bookie 3 drains: it waits, it does not re-request or shrink
    o = observed(s, 4, phases={3: P.IN_PROGRESS})
    assert steps(c.plan(s, o)) == [WaitDecommission(bid(3), 3, 5)]
    # the same observation always gives the same plan
    assert c.plan(s, o) == c.plan(s, o)


def test_undoing_a_scale_down_cancels_the_decommission():
    s = spec(5)
    acts = steps(c.plan(s, observed(s, 5, phases={4: P.IN_PROGRESS})))
    assert acts == [CancelDecommission(bid(4), 4)]


def test_config_change_restarts_one_bookie_at_a_time():
    s = spec(3, config={"journal-group-wait-ms": "5"})
    old = {o: "oldhash" for o in range(3)}
    acts = steps(c.plan(s, observed(s, 3, hashes=old)))
    assert acts == [RestartBookie(2, bid(2))]
    # bookie 2 restarted with the new config but is not ready yet: wait
    o = observed(s, 3, hashes={0: "oldhash", 1: "oldhash"}, ready={0, 1})
    actions = c.plan(s, o)
    assert steps(actions) == [] and "not ready" in cond(actions, "Progressing").message
    # ready again but ledgers under-replicated: still wait
    o = observed(s, 3, hashes={0: "oldhash", 1: "oldhash"}, under=2)
    actions = c.plan(s, o)
    assert steps(actions) == [] and "2 under-replicated" in cond(actions, "Progressing").message
    # healthy: next one
    assert steps(c.plan(s, observed(s, 3, hashes={0: "oldhash", 1: "oldhash"}))) == [RestartBookie(1, bid(1))]
    # done
    assert steps(c.plan(s, observed(s, 3))) == []


def test_invalid_spec_is_reported_not_acted_on():
    s = spec(2)  # below the default ensemble of 3
    actions = c.plan(s, observed(s, 3))
    assert steps(actions) == []
    assert cond(actions, "Degraded").reason == c.INVALID_SPEC
    assert "spec.replicas (2)" in cond(actions, "Degraded").message


def test_status_carries_counts_generation_and_stable_transition_times():
    s = spec(3)
    o = observed(s, 5, phases={4: P.IN_PROGRESS}, under=1)
    acts = c.plan(s, o)
    st = status(o, acts, None, generation=7, now="2026-01-01T00:00:00Z")
    assert st["observedGeneration"] == 7 and st["replicas"] == 5 and st["readyReplicas"] == 5
    assert st["underReplicatedLedgers"] == 1 and bid(4) in st["readonlyBookies"]
    assert st["decommissioning"] == {"bookie": bid(4), "ordinal": 4, "ledgersLeft": 5, "state": "in_progress"}
    assert all(cd["observedGeneration"] == 7 for cd in st["conditions"])
    again = conditions([a for a in acts if isinstance(a, SetCondition)], st["conditions"], 8,
                       now="2026-01-02T00:00:00Z")
    assert {cd["lastTransitionTime"] for cd in again} == {"2026-01-01T00:00:00Z"}


def test_volumes_a_ledger_still_needs_are_kept():
    # someone scaled the StatefulSet down by hand: bookie 3 vanished without a drain
    s = spec(3, pvcPolicy="Delete")
    o = observed(s, 3, extra_volumes=(3,))
    o.bookies[3] = dataclasses.replace(o.bookies[3], in_use=True)
    actions = c.plan(s, o)
    assert not any(isinstance(a, DeletePVCs) for a in actions)
    deg = cond(actions, "Degraded")
    assert deg.status and deg.reason == c.VOLUMES_IN_USE and bid(3) in deg.message
    # nothing references it (checked): its volumes go
    o.bookies[3] = dataclasses.replace(o.bookies[3], in_use=False)
    assert DeletePVCs(3) in c.plan(s, o)
    # metadata unknown: nothing is deleted
    assert not any(isinstance(a, DeletePVCs) for a in c.plan(s, dataclasses.replace(o, metadata=None)))
