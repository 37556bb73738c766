"""The registry with real `pybk bookie` processes: crashes, clean shutdowns, etcd outages."""
import pytest
import asyncio

from pybk.client.bookie_client import BookieClient
from pybk.entry import decode, encode, master_key

from allocation import allocate

TTL = 2


async def wait_for_state(store, bookie_id: str, state: str, timeout: float = 60.0) -> None:
    """Poll the registry until bookie_id is in state (writable|readonly|gone)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while (await store.registry.get(bookie_id))[0] != state:
        assert asyncio.get_running_loop().time() < deadline, f"{bookie_id} never became {state}"
        await asyncio.sleep(0.1)


async def test_killed_bookie_leaves_registry_within_lease_ttl_and_clean_shutdown_at_once(
        etcd, bookies, open_store):
    store = await open_store()
    uri = etcd.metadata_uri("pybk") + f"?lease_ttl={TTL}"
    crashed, stopped = bookies(2, metadata_uri=uri, registration_ttl=TTL)
    for b in (crashed, stopped):
        await wait_for_state(store, b.bookie_id, "writable")
    info = (await store.registry.writable())[stopped.bookie_id]
    assert info.grpc == stopped.address and info.http.endswith(str(stopped.http_port))

    crashed.kill()
    # Gone once the lease expires: TTL plus a margin for a loaded machine.
    await wait_for_state(store, crashed.bookie_id, "gone", timeout=TTL + 15)

    stopped.stop()
    assert (await store.registry.get(stopped.bookie_id))[0] == "gone", "clean shutdown unregisters at once"
    assert await store.registry.all() == {}


@pytest.mark.private_etcd
async def test_bookie_serves_held_ledgers_while_etcd_is_down_and_reregisters_after(etcd, bookies, open_store):
    uri = etcd.metadata_uri("pybk") + f"?lease_ttl={TTL}&timeout=1"
    (bookie,) = bookies(1, metadata_uri=uri, registration_ttl=TTL)
    store = await open_store()
    await wait_for_state(store, bookie.bookie_id, "writable")
    key = store.registry.key("writable", bookie.bookie_id)
    lease_before = (await store.etcd.get(key)).lease

    ledger, password = 77, b"pw"
    mk = master_key(password)
    await allocate(uri, [ledger], mk)
    acked: dict[int, bytes] = {}
    client = await BookieClient.connect(bookie.address)
    try:
        for e in range(10):
            payload = b"before-%d" % e
            await client.add(ledger, e, encode(ledger, e, e - 1, payload), master_key=mk)
            acked[e] = payload

        etcd.stop()
        await asyncio.sleep(TTL + 2)  # longer than the lease: the bookie's session is lost
        for e in range(10, 20):
            payload = b"during-%d" % e
            await asyncio.wait_for(client.add(ledger, e, encode(ledger, e, e - 1, payload), master_key=mk), 30)
            acked[e] = payload
        for e, payload in acked.items():
            assert decode(await client.read(ledger, e))[1] == payload

        etcd.start()
        deadline = asyncio.get_running_loop().time() + 60
        while True:
            kv = await store.etcd.get(key)
            if kv is not None and kv.lease != lease_before:
                break
            assert asyncio.get_running_loop().time() < deadline, "bookie did not re-register"
            await asyncio.sleep(0.2)
        assert (await store.registry.get(bookie.bookie_id))[0] == "writable"
        for e, payload in acked.items():
            assert decode(await client.read(ledger, e))[1] == payload
    finally:
        await client.close()
