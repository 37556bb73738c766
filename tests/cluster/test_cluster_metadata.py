"""What etcd says about a cluster, read through pybk.meta on a real etcd."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pybk.cluster import metadata
from pybk.cluster.observed import DecommissionPhase, Registration
from pybk.cluster.spec import load_manifest
from pybk.meta import BookieInfo, Cookie, MetadataStore
from pybk.meta.decommission import Decommission

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cluster.yaml"


@pytest.fixture
async def store(metadata_uri):
    s = await MetadataStore.connect(metadata_uri)
    yield s
    await s.close()


async def test_observe_reports_registry_drains_markers_and_open_ensembles(store):
    ids = [f"b{i}:3181" for i in range(4)]
    for bid in ids[:3]:
        await store.registry.register(BookieInfo(bookie_id=bid, grpc=bid))
    await store.registry.set_readonly(ids[2], True)
    open_md = await store.ledgers.create(ids[:3], 3, 2)
    closed = await store.ledgers.create(ids, 3, 2)
    closed.state = type(closed.state).CLOSED
    closed.last_entry_id = -1
    await store.ledgers.cas(closed)
    await store.underreplication.mark(open_md.ledger_id, [ids[2]])
    rec = await store.decommission.request(ids[2])
    await store.decommission.update(rec, state="draining", ledgers_total=3, ledgers_remaining=2)
    failed = await store.decommission.request(ids[3])
    await store.decommission.update(failed, state="failed", message="no bookie to copy to")

    meta, bookies = await metadata.observe(store, ids, need_ensemble=True)
    assert meta.under_replicated == 1 and meta.max_open_ensemble == 3  # the closed E4 ledger does not count
    assert [bookies[b].registration for b in ids] == [Registration.WRITABLE, Registration.WRITABLE,
                                                      Registration.READONLY, Registration.ABSENT]
    assert (bookies[ids[2]].decommission, bookies[ids[2]].ledgers_left) == (DecommissionPhase.IN_PROGRESS, 2)
    assert bookies[ids[3]].decommission is DecommissionPhase.FAILED
    assert bookies[ids[3]].message == "no bookie to copy to"
    assert bookies[ids[0]].decommission is DecommissionPhase.NONE
    meta, _ = await metadata.observe(store, ids)  # no scale-down pending: no ledger scan
    assert meta.max_open_ensemble == 0


def test_a_drain_record_is_in_progress_until_done_or_failed():
    def rec(state: str, remaining: int = -1) -> Decommission:
        return Decommission("b0:3181", state, ledgers_remaining=remaining, message="m")
    assert metadata.decommission_phase(None) == (DecommissionPhase.NONE, None, "")
    assert metadata.decommission_phase(rec("requested")) == (DecommissionPhase.IN_PROGRESS, None, "m")
    assert metadata.decommission_phase(rec("draining", 2)) == (DecommissionPhase.IN_PROGRESS, 2, "m")
    assert metadata.decommission_phase(rec("done", 0)) == (DecommissionPhase.DONE, 0, "m")
    assert metadata.decommission_phase(rec("failed", 1)) == (DecommissionPhase.FAILED, 1, "m")


def test_ledgers_are_read_only_for_a_pending_scale_down_or_volumes_about_to_be_deleted():
    spec = load_manifest(EXAMPLE)  # 3 replicas, pvcPolicy Retain
    assert metadata.ledger_checks(spec, 3, ["bookie-4"]) == (False, [])
    assert metadata.ledger_checks(spec, 4, []) == (True, [])
    delete = dataclasses.replace(spec, pvc_policy="Delete")
    assert metadata.ledger_checks(delete, 3, ["bookie-4"]) == (False, ["bookie-4"])


async def test_observe_also_reports_bookies_with_a_drain_record(store):
    rec = await store.decommission.request("gone:3181")
    await store.decommission.update(rec, state="done", ledgers_total=0, ledgers_remaining=0)
    _, bookies = await metadata.observe(store, ["b0:3181"])
    assert set(bookies) == {"b0:3181", "gone:3181"}
    assert bookies["gone:3181"].decommission is DecommissionPhase.DONE


async def test_a_bookie_is_drained_away_once_no_cookie_and_no_ledger_names_it(store):
    ids = [f"b{i}:3181" for i in range(4)]
    await store.cookies.create(Cookie("i", ids[0], "/j", ("/l",)))
    await store.ledgers.create(ids[1:3], 2, 2)
    assert [await metadata.drained_away(store, b) for b in ids] == [False, False, False, True]
