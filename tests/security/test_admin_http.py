"""Admin HTTP of bookies and autorecovery with TLS and an auth file: state changes need `admin`
(401 without a known credential, 403 with a lower role, the JSON `error` naming the cause), reads
need `reader`, the open paths need nothing. A refused state change leaves the bookie writable."""
from __future__ import annotations

import asyncio

import pytest
from allocation import allocate

from pybk import entry
from pybk.client.bookie_client import BookieClient

KEY = entry.master_key(b"pw")

STATE_CHANGES = [("PUT", "/api/v1/bookie/state/readonly", {"readOnly": True}),
                 ("POST", "/api/v1/bookie/gc", None),
                 ("POST", "/api/v1/bookie/scrub", None)]


def data(eid: int) -> bytes:
    return entry.encode(1, eid, eid - 1, f"entry {eid}".encode())


async def still_writable(bookie, pki, eid: int) -> None:
    """The bookie takes entry `eid`, still holds every entry before it unchanged, and says it is
    not read-only."""
    async with await BookieClient.connect(bookie.address, security=pki.client("writer")) as c:
        await c.add(1, eid, data(eid), master_key=KEY)
        assert [(e, b) async for e, b in c.read_range(1, 0, eid)] == [(i, data(i)) for i in range(eid + 1)]
        assert (await c.info())["read_only"] is False


@pytest.mark.parametrize("method,path,body", STATE_CHANGES, ids=[p for _, p, _ in STATE_CHANGES])
async def test_state_changes_without_admin_are_refused_and_change_nothing(bookies, pki, method, path, body):
    b, = bookies(1, metadata_uri=None, **pki.bookie_options())
    url = b.http_url + path
    await still_writable(b, pki, 0)
    status, answer = await asyncio.to_thread(pki.http, url, method, None, body)
    assert status == 401 and "no credential" in answer["error"], answer
    status, answer = await asyncio.to_thread(pki.http, url, method, None, body, "forged-token")
    assert status == 401 and "unknown bearer token" in answer["error"], answer
    for role in ("reader", "writer"):
        status, answer = await asyncio.to_thread(pki.http, url, method, role, body)
        assert status == 403, (role, answer)
        assert f"{role}-client has role {role}" in answer["error"] and "needs role admin" in answer["error"]
    await still_writable(b, pki, 1)
    status, answer = await asyncio.to_thread(pki.http, b.http_url + "/api/v1/bookie/state", "GET", "reader")
    assert status == 200 and answer["readOnly"] is False and answer["readOnlyForced"] is False


async def test_admin_turns_the_bookie_read_only(bookies, pki):
    b, = bookies(1, metadata_uri=None, **pki.bookie_options())
    status, answer = await asyncio.to_thread(pki.http, b.http_url + "/api/v1/bookie/state/readonly", "PUT",
                                             "admin", {"readOnly": True})
    assert status == 200 and answer["readOnly"] is True and answer["forced"] is True


async def test_open_paths_answer_without_credentials_and_others_need_a_reader(bookies, pki):
    b, = bookies(1, **pki.bookie_options())
    for path in ("/heartbeat", "/metrics", "/api/v1/bookie/is_ready"):
        status, _ = await asyncio.to_thread(pki.http, b.http_url + path)
        assert status == 200, path
    for path in ("/api/v1/bookie/info", "/api/v1/ledger/list", "/api/v1/autorecovery/status"):
        status, answer = await asyncio.to_thread(pki.http, b.http_url + path)
        assert status == 401 and "no credential" in answer["error"], (path, answer)
        status, answer = await asyncio.to_thread(pki.http, b.http_url + path, "GET", "reader")
        assert status == 200, (path, answer)


async def test_open_paths_are_configurable(bookies, pki):
    b, = bookies(1, **pki.bookie_options(open_http_paths="/heartbeat,/api/v1/bookie/is_ready"))
    assert (await asyncio.to_thread(pki.http, b.http_url + "/heartbeat"))[0] == 200
    status, answer = await asyncio.to_thread(pki.http, b.http_url + "/metrics")
    assert status == 401 and "no credential" in answer["error"]


async def test_autorecovery_decommission_and_audit_need_admin(bookies, pki, metadata_uri, tmp_path):
    from pybk.local.autorecovery import AutoRecoveryProcess
    bookie, _ = bookies(2, **pki.bookie_options())
    await allocate(metadata_uri, [1], KEY)  # bookies take keys only for allocated ledgers
    ar = AutoRecoveryProcess(tmp_path / "autorecovery.log", metadata_uri, tls_cert=pki.server.cert,
                             tls_key=pki.server.key, tls_ca=pki.server.ca, auth_file=pki.auth_file,
                             token_file=pki.tokens["admin"]).start()
    try:
        assert ar.http_url.startswith("https://")
        decommission = ar.http_url + "/api/v1/autorecovery/decommission"
        await still_writable(bookie, pki, 0)
        for role, code in ((None, 401), ("reader", 403), ("writer", 403)):
            status, answer = await asyncio.to_thread(pki.http, decommission, "POST", role,
                                                     {"bookie_id": bookie.bookie_id})
            assert status == code and "error" in answer, (role, answer)
            status, answer = await asyncio.to_thread(pki.http, ar.http_url + "/api/v1/autorecovery/trigger_audit",
                                                     "PUT", role)
            assert status == code and "error" in answer, (role, answer)
        await still_writable(bookie, pki, 1)
        status, answer = await asyncio.to_thread(pki.http, ar.http_url + "/api/v1/autorecovery/status", "GET",
                                                 "reader")
        assert status == 200, answer
        # the admin may: autorecovery makes the bookie read-only through its (secured) admin API
        status, answer = await asyncio.to_thread(pki.http, decommission, "POST", "admin",
                                                 {"bookie_id": bookie.bookie_id})
        assert status == 202, answer
        status, state = await asyncio.to_thread(pki.http, bookie.http_url + "/api/v1/bookie/state", "GET", "reader")
        assert state["readOnlyForced"] is True
    finally:
        ar.stop()
