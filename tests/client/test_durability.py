"""Randomised durability: no acknowledged entry is lost, duplicated or changed by bookie or
writer crashes. Rounds of random pipelined adds (random E/Qw/Qa, windows, lengths) with kill -9
of at most Qa - 1 bookies at a time and occasional writer crashes (a child writer killed with -9).
After recovery every acked entry is present, once, in order, with its exact payload; at the
end every ledger of every round is read again."""
from __future__ import annotations

import os
import random

from client_helpers import ChildWriter, expected, pipelined, read_all

from pybk.client import BookKeeper
from pybk.client.errors import BKError
from pybk.meta import LedgerState

ROUNDS = int(os.environ.get("PYBK_DURABILITY_ROUNDS", "12"))
# (E, Qw, Qa) per round: whole copies, striped ensembles, and Qw = Qa (a kill needs a spare bookie)
CONFIGS = [(3, 3, 2), (3, 3, 2), (4, 3, 2), (5, 3, 2), (4, 2, 2)]


async def _writer_round(bk, rng, kill_one, n: int, window: int, force_kill: bool, cfg):
    lh = await bk.create_ledger(*cfg, password=b"pw")
    kill_at = rng.randrange(n) if force_kill or rng.random() < 0.6 else -1
    errors: list = []

    def fault(i: int) -> None:
        if i == kill_at:
            kill_one(lh.metadata.current_ensemble)

    acked = await pipelined(lh, n, window, before_add=fault, errors=errors)
    assert not errors, f"adds failed with at most Qa-1 bookies down: {errors[:3]}"
    await lh.close()
    return lh.ledger_id, acked


async def _crash_round(uri, tmp_path, rng, kill_one, round_no: int, force_kill: bool, cfg):
    e, qw, qa = cfg
    child = ChildWriter(uri, tmp_path / f"writer-{round_no}.log", e, qw, qa, count=-1,
                        window=rng.choice([1, 16, 128])).start()
    try:
        await child.wait_acked(rng.randrange(20, 300))
        if force_kill or rng.random() < 0.5:
            async with await BookKeeper.connect(uri) as bk:
                kill_one((await bk.ledger_metadata(child.ledger_id)).current_ensemble)
            await child.wait_acked(len(child.acked()) + rng.randrange(1, 200))
    finally:
        child.kill()
    return child.ledger_id, child.acked()


async def test_random_adds_with_bookie_kills_and_writer_crashes_lose_no_acked_entry(cluster_factory, tmp_path):
    """Random adds while bookies are killed and writers crash: no acknowledged entry is lost, and every
    reader sees the same entries.

    Slow: rounds of adds with bookies killed -9 and restarted and writers crashed, each round waiting for
    recovery; fewer rounds would reach fewer of the interleavings it exists to find."""
    seed = int(os.environ.get("PYBK_DURABILITY_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    cluster = cluster_factory(5)
    dead: list = []

    def kill_one(ensemble):
        if dead:                      # at most Qa - 1 = 1 bookie down at a time
            return
        victim = cluster.by_id(rng.choice(list(ensemble)))
        victim.kill()
        dead.append(victim)

    ledgers: dict[int, list[int]] = {}
    async with await BookKeeper.connect(cluster.uri) as bk:
        for r in range(ROUNDS):
            # round 0 kills a bookie under an in-process writer, round 1 under a writer that crashes
            cfg = CONFIGS[0] if r < 2 else rng.choice(CONFIGS)
            if r == 1 or (r > 1 and rng.random() < 0.3):
                lid, acked = await _crash_round(cluster.uri, tmp_path, rng, kill_one, r, r == 1, cfg)
            else:
                lid, acked = await _writer_round(bk, rng, kill_one, rng.randrange(50, 1500),
                                                 rng.choice([1, 8, 64, 256]), r == 0, cfg)
            ledgers[lid] = acked
            rh = await bk.open_ledger(lid, password=b"pw")          # recovers a crashed writer's ledger
            assert rh.metadata.state is LedgerState.CLOSED
            last = rh.metadata.last_entry_id
            assert sorted(acked) == list(range(len(acked))), f"seed {seed}: acks out of order"
            assert last >= len(acked) - 1, f"seed {seed} round {r} {cfg}: acked {len(acked)}, ledger ends at {last}"
            try:
                got = await read_all(rh)
            except BKError as e:    # which bookies were down, and why, names the cause
                raise AssertionError(f"seed {seed} round {r} {cfg}: {e}\n{cluster.report()}") from e
            assert got == expected(lid, last), f"seed {seed} round {r} {cfg}: wrong entries"
            for b in dead:
                cluster.restart(b)
            dead.clear()
        for lid, acked in ledgers.items():
            rh = await bk.open_ledger(lid, password=b"pw")
            assert await read_all(rh) == expected(lid, rh.metadata.last_entry_id), f"seed {seed}: ledger {lid}"
