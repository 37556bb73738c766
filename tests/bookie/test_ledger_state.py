"""Ledger state (pybk.bookie.state): what journal records say of it, and the LAC long-polls."""
from __future__ import annotations

import asyncio

from pybk import entry
from pybk.bookie.journal import RecordType
from pybk.bookie.state import STATE_RECORDS, LacWaiters, LedgerState, apply_record


def test_each_record_type_changes_what_it_carries():
    st = LedgerState()
    apply_record(st, int(RecordType.ADD), 5, entry.encode(1, 5, 3, b"x"))
    apply_record(st, int(RecordType.MASTER_KEY), -1, b"key")
    apply_record(st, int(RecordType.LAC), 7, b"")
    apply_record(st, int(RecordType.LAC), 6, b"")
    assert (st.lac, st.master_key, st.explicit_lac, st.fenced) == (3, b"key", 7, False)
    apply_record(st, int(RecordType.FENCE), -1, b"")
    assert st.fenced and st.last_add_confirmed == 7
    assert int(RecordType.ADD) not in STATE_RECORDS


async def test_a_long_poll_returns_when_woken_past_its_lac_or_at_its_timeout():
    waiters = LacWaiters()
    lac = {"now": 1}
    poll = asyncio.ensure_future(waiters.wait(1, 1, lambda: lac["now"], 5))
    await asyncio.sleep(0.01)
    assert 1 in waiters
    lac["now"] = 2
    waiters.wake(1)
    assert await poll == 2 and 1 not in waiters
    assert await waiters.wait(1, 2, lambda: lac["now"], 0.05) == 2
