"""The log side of the BookieLog controller on a real etcd: observing a log, and acting only on the
log that was observed (a name deleted and created again meanwhile is left alone)."""
from __future__ import annotations

import pytest

from pybk.client import BookKeeper
from pybk.cluster.bookielog.actions import DeleteLog, ReconfigureLog
from pybk.cluster.bookielog.spec import BookieLogSpec
from pybk.cluster.bookielog.store import LogChangedError, execute, observe_log
from pybk.log import LogConfig, Logs, Retention, RetentionPolicy

PW = b"store-test"
SPEC = BookieLogSpec.from_manifest({"apiVersion": "pybk.io/v1alpha1", "kind": "BookieLog",
                                    "metadata": {"name": "orders"},
                                    "spec": {"cluster": "demo", "passwordSecretRef": {"name": "pw"}}})


async def test_observe_tells_whether_the_password_is_the_logs(metadata_uri):
    async with await BookKeeper.connect(metadata_uri) as bk:
        logs = Logs(bk)
        assert await observe_log(logs, "orders", PW) is None
        ref = await logs.create("orders", password=PW)
        seen = await observe_log(logs, "orders", PW)
        assert (seen.log_id, seen.config, seen.password_matches) == (ref.log_id, LogConfig(), True)
        assert (seen.start_offset, seen.end_offset, seen.segments, seen.writer) == (0, 0, (), None)
        assert not (await observe_log(logs, "orders", b"wrong")).password_matches


async def test_actions_planned_for_a_log_do_not_touch_its_successor(metadata_uri):
    async with await BookKeeper.connect(metadata_uri) as bk:
        logs = Logs(bk)
        first = await logs.create("orders", password=PW)
        await logs.delete("orders", password=PW)
        second = await logs.create("orders", password=PW)
        change = ReconfigureLog(LogConfig(retention=Retention(RetentionPolicy.INTEREST)), ("retention.policy",))
        with pytest.raises(LogChangedError, match=f"is now id {second.log_id}, not id {first.log_id}"):
            await execute(logs, SPEC, PW, [change], first.log_id)
        with pytest.raises(LogChangedError):
            await execute(logs, SPEC, PW, [DeleteLog(first.log_id)], first.log_id)
        assert (await logs.ref("orders")).config == LogConfig()
        assert await execute(logs, SPEC, PW, [change, DeleteLog(second.log_id)], second.log_id) == second.log_id
        assert await logs.list() == []
