"""`Logs.reconfigure` on real etcd and bookies: a new retention is what the next enforcement uses,
new replication is what writers opened afterwards make their segments with, the digest stays."""
from __future__ import annotations

import pytest

from pybk.client import BookKeeper, DigestType, UnauthorizedError
from pybk.log import (InvalidLogConfigError, LogConfig, LogNotFoundError, Logs, Retention, RetentionPolicy,
                      Rollover, SegmentState)

PW = b"log-password"


async def test_retention_and_replication_changes_take_effect(cluster):
    uri, _ = cluster
    async with await BookKeeper.connect(uri) as bk:
        logs = Logs(bk)
        await logs.create("orders", LogConfig(ensemble=2, write_quorum=2, ack_quorum=2,
                                              rollover=Rollover(max_records=10)), password=PW)
        async with await logs.open_writer("orders", password=PW) as w:
            for i in range(35):
                await w.append(b"r%d" % i)
            await w.roll()
        assert await logs.enforce_retention("orders", password=PW) is None      # policy none: nothing goes

        wanted = LogConfig(ensemble=3, write_quorum=3, ack_quorum=2, rollover=Rollover(max_records=10),
                           retention=Retention(RetentionPolicy.LIMITS, max_bytes=0))
        ref = await logs.reconfigure("orders", wanted, password=PW)
        assert ref.config == wanted and (await logs.ref("orders")).config == wanted
        start = await logs.enforce_retention("orders", password=PW)
        assert start is not None and start > 0 and await logs.start_offset("orders") == start

        async with await logs.open_writer("orders", password=PW) as w:
            await w.append(b"after")
        d = await logs.describe("orders")
        newest = d.segments[-1]
        md = await bk.store.ledgers.get(newest.ledger_id)
        assert (md.ensemble_size, md.write_quorum, md.ack_quorum) == (3, 3, 2)
        assert [s.state for s in d.segments][-1] is SegmentState.CLOSED


async def test_refusals_name_the_cause(cluster):
    uri, _ = cluster
    async with await BookKeeper.connect(uri) as bk:
        logs = Logs(bk)
        await logs.create("a", password=PW)
        with pytest.raises(UnauthorizedError, match="^reconfiguring log 'a' needs its password"):
            await logs.reconfigure("a", LogConfig(), password=b"wrong")
        with pytest.raises(InvalidLogConfigError, match="digest CRC32C: its segments are written with it"):
            await logs.reconfigure("a", LogConfig(digest=DigestType.MAC), password=PW)
        with pytest.raises(InvalidLogConfigError, match="replication"):
            await logs.reconfigure("a", LogConfig(ensemble=2, write_quorum=3), password=PW)
        with pytest.raises(LogNotFoundError):
            await logs.reconfigure("missing", LogConfig(), password=PW)
        assert (await logs.ref("a")).config == LogConfig()
