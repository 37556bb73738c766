"""A log of many segments (written straight into the test's real etcd): finding a segment by offset
and opening a writer read a few keys, not the whole list, and find the right segment whatever the
segments' sizes."""
from __future__ import annotations

import bisect
import random

from pybk.client import BookKeeper
from pybk.log import Logs, SegmentState
from pybk.log.layout import Head, Segment
from pybk.log.reader import find_segment
from pybk.meta.etcd import op_put

PW = b"log-password"


async def _fake_segments(logs: Logs, name: str, sizes: list[int], first_seq: int = 0):
    """A log whose segments first_seq.. hold `sizes` records each (ledgers that do not exist: only
    the keys are looked at)."""
    ref = await logs.create(name, password=PW)
    k = logs.meta.keys
    starts, offset = [], 0
    for i in range(0, len(sizes), 100):
        ops = []
        for j, n in enumerate(sizes[i:i + 100], start=i):
            ops.append(op_put(k.segment(ref.log_id, first_seq + j), Segment(
                first_seq + j, 1 << 40 | j, SegmentState.CLOSED, 1, offset, n, n * 10).to_bytes()))
            starts.append(offset)
            offset += n
        await logs.meta.etcd.txn([], ops)
    await logs.meta.etcd.put(k.head(ref.log_id), Head(1, "test", last_seq=first_seq + len(sizes) - 1).to_bytes())
    return ref, starts, offset


async def test_find_segment_agrees_with_a_scan_of_uneven_segments(metadata_uri):
    rng = random.Random(7)
    sizes = [rng.choice([0, 1, 5, 100, 1000, 20000]) for _ in range(3000)]
    async with await BookKeeper.connect(metadata_uri) as bk:
        logs = Logs(bk)
        for name, first_seq in (("uneven", 0), ("truncated-prefix", 500)):
            ref, starts, end = await _fake_segments(logs, name, sizes, first_seq)
            reads = 0
            segment = logs.meta.segment

            async def counted(log_id: int, seq: int):
                nonlocal reads
                reads += 1
                return await segment(log_id, seq)
            logs.meta.segment = counted
            for offset in [0, 1, end - 1, end, end + 10] + [rng.randrange(end) for _ in range(200)]:
                want = first_seq + bisect.bisect_right(starts, offset) - 1
                got = await find_segment(logs, ref, offset)
                assert got.seq == want, (name, offset)
            logs.meta.segment = segment
            assert reads / 205 < 30   # a search, not a scan: at most about twice log2(3000) reads each
