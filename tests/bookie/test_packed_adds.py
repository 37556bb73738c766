"""Packed runs on the Add stream (AddBatch.runs), shown against a real `pybk bookie` process,
also from a hostile client that writes malformed runs straight onto the wire."""
from __future__ import annotations

import random

import grpc

from pybk import entry
from pybk.client.bookie_client import BookieClient
from pybk.proto.wire import ADD_RUNS_HEADER
from pybk.proto import pb

from allocation import allocate

KEY = entry.master_key(b"secret")
TTL = 2


def body(ledger: int, eid: int, lac: int = -1, size: int = 200) -> bytes:
    rnd = random.Random(ledger * 1_000_003 + eid)
    return entry.encode(ledger, eid, lac, rnd.randbytes(size))


def run(rid: int, ledger: int, ids: list[int], bodies: list[bytes], key: bytes = KEY, flags: int = 0,
        sizes: list[int] | None = None) -> pb.AddRun:
    return pb.AddRun(request_id=rid, ledger_id=ledger, master_key=key, flags=flags, entry_ids=ids,
                     body_sizes=sizes if sizes is not None else [len(b) for b in bodies], bodies=b"".join(bodies))


async def exchange(address: str, *batches: pb.AddBatch) -> tuple[list[pb.AddResults], dict]:
    """Each batch on one raw Add stream, as any client could write it; (the answers, the
    stream's initial metadata)."""
    async with grpc.aio.insecure_channel(address) as ch:
        call = ch.stream_stream("/pybk.Bookie/Add", request_serializer=pb.AddBatch.SerializeToString,
                                response_deserializer=pb.AddResults.FromString)()
        answers = []
        for batch in batches:
            await call.write(batch)
            answers.append(await call.read())
        await call.done_writing()
        return answers, dict(await call.initial_metadata())


async def stored(address: str, ledger: int) -> dict[int, bytes]:
    async with await BookieClient.connect(address, wait=30) as c:
        return {e: b for first, last in await c.list_entries(ledger)
                for e, b in [(i, await c.read(ledger, i)) for i in range(first, last + 1)]}


async def test_a_packed_run_is_stored_and_acked_like_single_adds(bookies, metadata_uri):
    bk, = bookies(1, registration_ttl=TTL)
    await allocate(metadata_uri, [61, 62], KEY)
    bodies = [body(61, i, i - 1) for i in range(50)]
    batch = pb.AddBatch(entries=[pb.AddEntry(request_id=900, ledger_id=62, entry_id=0, master_key=KEY,
                                             body=body(62, 0))],
                        runs=[run(1, 61, list(range(0, 20)), bodies[:20]), run(21, 61, list(range(20, 50)), bodies[20:])])
    (answer,), metadata = await exchange(bk.address, batch)
    assert metadata.get(ADD_RUNS_HEADER) == "1"
    assert [(r.request_id, r.status) for r in answer.results] == [(900, pb.OK)]
    assert [(r.request_id, r.status, len(r.failures)) for r in answer.runs] == [(1, pb.OK, 0), (21, pb.OK, 0)]
    assert await stored(bk.address, 61) == dict(enumerate(bodies))
    assert await stored(bk.address, 62) == {0: body(62, 0)}
    async with await BookieClient.connect(bk.address, wait=30) as c:
        assert await c.read_lac(61) == 48


async def test_a_malformed_packed_run_gets_bad_request_and_stores_nothing(bookies, metadata_uri):
    bk, = bookies(1, registration_ttl=TTL)
    await allocate(metadata_uri, [63, 64], KEY)
    async with await BookieClient.connect(bk.address, wait=30) as c:
        await c.add(63, 0, body(63, 0), master_key=KEY)  # acked before the attack
    b1, b2 = body(64, 0), body(64, 1, 0)
    malformed = [
        (run(1, 64, [0, 1], [b1, b2], sizes=[len(b1)]), "2 entry ids and 1 body sizes"),
        (run(2, 64, [0, 1], [b1, b2], sizes=[len(b1), len(b2) + 5]), "body sizes sum to"),
        (run(3, 64, [0, 1], [b1, b2], sizes=[len(b1), len(b2) - 5]), "body sizes sum to"),
        (run(4, 64, [], []), "0 entry ids and 0 body sizes"),
        (run(5, 64, [0, 1], [b1[:10], b1[10:] + b2], sizes=[10, len(b1) - 10 + len(b2)]), "shorter than an entry header"),
    ]
    good = run(6, 63, [1], [body(63, 1, 0)])
    (answer,), _ = await exchange(bk.address, pb.AddBatch(runs=[r for r, _ in malformed] + [good]))
    for (sent, why), res in zip(malformed, answer.runs):
        assert res.request_id == sent.request_id and res.status == pb.BAD_REQUEST, res
        assert res.message.startswith("malformed run of ledger 64") and why in res.message, res.message
    assert answer.runs[-1].request_id == 6 and answer.runs[-1].status == pb.OK
    assert bk.alive()
    assert await stored(bk.address, 64) == {}
    assert await stored(bk.address, 63) == {0: body(63, 0), 1: body(63, 1, 0)}


async def test_a_packed_run_with_a_wrong_master_key_is_refused_for_every_entry(bookies, metadata_uri):
    bk, = bookies(1, registration_ttl=TTL)
    await allocate(metadata_uri, [65], KEY)
    async with await BookieClient.connect(bk.address, wait=30) as c:
        await c.add(65, 0, body(65, 0), master_key=KEY)
    bodies = [body(65, i, 0) for i in range(1, 6)]
    (answer,), _ = await exchange(bk.address, pb.AddBatch(
        runs=[run(1, 65, list(range(1, 6)), bodies, key=entry.master_key(b"wrong"))]))
    res, = answer.runs
    assert (res.status, list(res.failures)) == (pb.UNAUTHORIZED, [])
    assert "wrong master key for ledger 65" in res.message
    assert await stored(bk.address, 65) == {0: body(65, 0)}


async def test_entries_of_a_packed_run_are_checked_one_by_one(bookies, metadata_uri):
    bk, = bookies(1, registration_ttl=TTL, max_entry_size=4096)
    await allocate(metadata_uri, [66], KEY)
    bodies = [body(66, 0), body(66, 7), body(66, 2, 1), body(66, 3, 3), body(66, 4, 3, size=5000), body(66, 5, 4)]
    (answer,), _ = await exchange(bk.address, pb.AddBatch(runs=[run(1, 66, list(range(6)), bodies)]))
    res, = answer.runs
    assert res.status == pb.OK
    assert [(f.index, f.entry_id, f.status) for f in res.failures] == [
        (1, 1, pb.BAD_REQUEST), (3, 3, pb.BAD_REQUEST), (4, 4, pb.BAD_REQUEST)]
    assert "body header says 66:7" in res.failures[0].message  # the first refusal of a status says why
    assert await stored(bk.address, 66) == {0: bodies[0], 2: bodies[2], 5: bodies[5]}


async def test_a_packed_run_on_a_fenced_ledger_is_refused_unless_it_is_a_recovery_run(bookies, metadata_uri):
    bk, = bookies(1, registration_ttl=TTL)
    await allocate(metadata_uri, [67], KEY)
    async with await BookieClient.connect(bk.address, wait=30) as c:
        await c.add(67, 0, body(67, 0), master_key=KEY)
        assert await c.fence(67, KEY) == -1
    bodies = [body(67, i, 0) for i in range(1, 4)]
    (normal, recovery), _ = await exchange(bk.address, pb.AddBatch(runs=[run(1, 67, [1, 2, 3], bodies)]),
                                           pb.AddBatch(runs=[run(2, 67, [1, 2, 3], bodies, flags=pb.RECOVERY_ADD)]))
    assert (normal.runs[0].status, normal.runs[0].message) == (pb.FENCED, "ledger 67 is fenced")
    assert (recovery.runs[0].status, len(recovery.runs[0].failures)) == (pb.OK, 0)
    assert await stored(bk.address, 67) == {0: body(67, 0), **dict(zip([1, 2, 3], bodies))}


async def test_a_client_packs_adds_of_one_ledger_into_runs_and_each_add_gets_its_own_outcome(bookies, metadata_uri):
    bk, = bookies(1, registration_ttl=TTL)
    await allocate(metadata_uri, [68], KEY)
    async with await BookieClient.connect(bk.address, wait=30) as c:
        got: list = []

        def sink(acked, failed):
            got.append((list(acked), [(e, x.code.name) for e, x in failed]))
        for i in range(10):
            c.add_to_run(68, i, body(68, i, i - 1) if i != 4 else body(68, 40), KEY, False, sink)
        await c.add(68, 10, body(68, 10, 9), master_key=KEY)  # answered after the runs before it
    assert sorted(e for acked, _ in got for e in acked) == [0, 1, 2, 3, 5, 6, 7, 8, 9]
    assert [f for _, failed in got for f in failed] == [(4, "BAD_REQUEST")]
    assert len(got) < 10  # one call per run, not one per add
