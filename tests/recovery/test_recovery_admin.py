"""Autorecovery's shell commands and admin API against a real cluster."""
from __future__ import annotations

import asyncio
import json
import os
import sys
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from pybk.client import BookKeeper
from pybk.meta import LedgerState, MetadataStore

from recovery_checks import PASSWORD, assert_fully_replicated, eventually


async def shell(uri: str, *argv: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "pybk.cli", "shell", *argv, "--metadata-uri",
                                                uri, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 240)
    return proc.returncode, out.decode(), err.decode()


async def test_shell_and_admin_api_list_trigger_recover_and_decommission(bookies, short_lease_uri, autorecovery):
    procs = bookies(4, metadata_uri=short_lease_uri, registration_ttl=2)
    store = await MetadataStore.connect(short_lease_uri)
    bk = await BookKeeper.connect(short_lease_uri)
    try:
        written = {}
        for _ in range(4):
            lh = await bk.create_ledger(ensemble=2, write_quorum=2, ack_quorum=2, password=PASSWORD)
            payloads = [os.urandom(100) for _ in range(50)]
            await asyncio.gather(*(lh.add_entry_async(p) for p in payloads))
            await lh.close()
            written[lh.ledger_id] = payloads
        ar = autorecovery(lost_bookie_delay=600)
        await eventually(lambda: _leads(ar), 60, what="the autorecovery process to be elected")

        rc, out, err = await shell(short_lease_uri, "whoisauditor", "-o", "json")
        assert rc == 0, err
        assert json.loads(out)["id"] == ar.recovery_name
        rc, out, _ = await shell(short_lease_uri, "listunderreplicated")
        assert rc == 0 and "no ledger is under-replicated" in out

        rc, out, err = await shell(short_lease_uri, "triggeraudit", "-o", "json")
        assert rc == 0 and json.loads(out)["triggered"], err
        await eventually(lambda: _audited(ar), 60, what="the triggered audit to run")
        assert _metric(ar, "pybk_recovery_last_audit_timestamp_seconds") > 0

        # a dead bookie: nothing happens by itself (delay 600 s); `recover` re-replicates it now
        counts = {p.bookie_id: 0 for p in procs}
        for lid in written:
            for b in (await store.ledgers.get(lid)).bookies():
                counts[b] += 1
        dead = next(p for p in procs if p.bookie_id == max(counts, key=counts.get))
        dead.kill()
        await eventually(lambda: _gone(store, dead.bookie_id), 60, what="the killed bookie to leave the registry")
        rc, out, err = await shell(short_lease_uri, "recover", dead.bookie_id, "--timeout", "200")
        assert rc == 0, err
        assert "recovered" in out
        rc, out, _ = await shell(short_lease_uri, "listunderreplicated", "-o", "json")
        assert rc == 0 and json.loads(out) == []
        assert _metric(ar, "pybk_recovery_bytes_replicated_total") > 0

        # decommission through the admin API, then watch it finish from the shell
        live = [p for p in procs if p is not dead]
        leaving = next(p for p in live if counts[p.bookie_id])
        status, body = ar.http_json("/api/v1/autorecovery/decommission", "POST", {"bookie_id": leaving.bookie_id})
        assert status == 202, body
        status, body = ar.http_json("/api/v1/autorecovery/decommission", "POST", {})
        assert status == 400 and "bookie_id" in body["error"]
        rc, out, err = await shell(short_lease_uri, "decommission", leaving.bookie_id, "--timeout", "200")
        assert rc == 0, err
        assert "decommissioned" in out and "ledgers drained" in err
        assert await store.cookies.get(leaving.bookie_id) is None
        status, body = ar.http_json(f"/api/v1/autorecovery/decommission?bookie_id={leaving.bookie_id}")
        assert status == 200 and body["state"] == "done" and body["ledgers_remaining"] == 0
        state, _ = await store.registry.get(leaving.bookie_id)
        assert state == "readonly"
        drained = {"bookie": leaving.bookie_id}
        await eventually(lambda: _drain_shown(ar, leaving.bookie_id), 60,
                         what="the finished drain in the decommission metrics")
        # the shell's request came after the API's drain had finished: it started (and ended) with nothing left
        assert _metric(ar, "pybk_recovery_decommission_ledgers", drained) is not None
        rest = {p.bookie_id: p.address for p in live if p is not leaving}
        await assert_fully_replicated(store, rest, written)

        rc, out, err = await shell(short_lease_uri, "decommission", "nosuchbookie:1")
        assert rc == 1 and "unknown bookie" in err
        # two bookies left and E2 ledgers on them: draining one more would strand its ledgers
        rc, out, err = await shell(short_lease_uri, "decommission", next(iter(rest)))
        assert rc == 1 and "only 1 other writable bookies" in err, err
        state, _ = await store.registry.get(next(iter(rest)))
        assert state == "writable"
    finally:
        await bk.close()
        await store.close()


def _metric(ar, name: str, labels: dict | None = None) -> float | None:
    """One sample of the autorecovery process's /metrics (None when it has none)."""
    with urllib.request.urlopen(ar.http_url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == (labels or {}):
                return sample.value
    return None


async def _drain_shown(ar, bookie_id: str) -> bool:
    return _metric(ar, "pybk_recovery_decommission_remaining_ledgers", {"bookie": bookie_id}) == 0


async def _audited(ar) -> bool:
    status, body = ar.http_json("/api/v1/autorecovery/status")
    return status == 200 and body["last_audit"] is not None and body["last_audit"]["ledgers"] == 4


async def _gone(store, bookie_id: str) -> bool:
    state, _ = await store.registry.get(bookie_id)
    return state == "gone"


async def test_placement_check_reports_fragments_that_do_not_spread_zones(bookies, short_lease_uri, autorecovery):
    zone_a = bookies(2, metadata_uri=short_lease_uri, zone="a")
    bookies(2, metadata_uri=short_lease_uri, zone="b")
    store = await MetadataStore.connect(short_lease_uri)
    try:
        md = await store.ledgers.create([p.bookie_id for p in zone_a], 2, 2)
        await store.ledgers.cas(md.replace(state=LedgerState.CLOSED))
        ar = autorecovery()
        await eventually(lambda: _leads(ar), 60, what="the autorecovery process to be elected")
        status, body = ar.http_json("/api/v1/autorecovery/trigger_audit", "PUT")
        assert status == 200 and body["triggered"]
        await eventually(lambda: _has_violation(ar), 60, what="the audit to report the placement violation")
        status, body = ar.http_json("/api/v1/autorecovery/status")
        assert body["last_audit"]["placement_violations"] == [
            f"ledger {md.ledger_id} fragment 0: ensemble spans 1 zone(s), 2 possible"]
        with urllib.request.urlopen(ar.http_url + "/metrics", timeout=10) as resp:
            assert "pybk_recovery_placement_violations 1.0" in resp.read().decode()
    finally:
        await store.close()


async def _has_violation(ar) -> bool:
    status, body = ar.http_json("/api/v1/autorecovery/status")
    return status == 200 and bool(body["last_audit"] and body["last_audit"]["placement_violations"])


async def _leads(ar) -> bool:
    status, body = ar.http_json("/api/v1/autorecovery/status")
    return status == 200 and body["is_auditor"]


async def test_a_malformed_decommission_request_gets_400_naming_what_is_wrong(autorecovery, short_lease_uri):
    """A body that is not a JSON object, or a bookie id that could not be one, is answered 400 with
    a reason; nothing is recorded for it."""
    ar = autorecovery()
    for body, reason in (([1, 2], "JSON object"), ("str", "JSON object"), ({"bookie_id": 7}, "missing bookie_id"),
                         ({"bookie_id": "../../x"}, "bad bookie id")):
        status, answer = ar.http_json("/api/v1/autorecovery/decommission", "POST", body)
        assert status == 400, (body, answer)
        assert reason in answer["error"], (body, answer)
    status, drains = ar.http_json("/api/v1/autorecovery/decommission")
    assert status == 200 and not drains
