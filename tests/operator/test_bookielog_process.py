"""The real `pybk operator` process runs BookieLog resources against a Kubernetes API (kmock, see
kube_api.py), a real etcd and three real bookies: the log is created in etcd with the spec's
configuration, the status follows the log, spec changes are applied, deletion follows the
deletionPolicy, a bad spec is reported without a retry loop, and a restarted operator finishes
what it was doing.

The BookieCluster object only tells the operator the cluster's metadata URI here: the bookies are
started by the test, registered in the same etcd (no stand-in kubelet is needed for logs).
"""
from __future__ import annotations

import base64

import pytest
from kube_api import NAMESPACE
from polling import eventually
from test_operator_process import CLUSTER, FINALIZER, Api, Operator, condition, manifest

from pybk.client import BookKeeper
from pybk.cluster.bookielog.controller import Reason
from pybk.log import (LogConfig, LogNotFoundError, Logs, Retention, RetentionPolicy, Rollover)

LOGS = f"/apis/pybk.io/v1alpha1/namespaces/{NAMESPACE}/bookielogs"
SECRETS = f"/api/v1/namespaces/{NAMESPACE}/secrets"
PASSWORD = b"bookielog-test"
TIMEOUT = 60.0
# a segment per 10 records, so a few dozen records make closed segments for retention to delete
ROLLOVER = {"maxRecords": 10}
CONFIG = LogConfig(rollover=Rollover(max_records=10))


def bookielog(name: str = "orders", **spec) -> dict:
    return {"apiVersion": "pybk.io/v1alpha1", "kind": "BookieLog", "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"cluster": "demo", "passwordSecretRef": {"name": "orders-password"}, "rollover": ROLLOVER,
                     **spec}}


@pytest.fixture
async def world(kube, tmp_path, metadata_uri, bookies):
    """(api, operator, logs): the emulator holding the BookieCluster and the password Secret, the
    operator running, and a log client of the cluster's etcd and bookies."""
    bookies(3)
    api = Api(kube.url)
    api.create(CLUSTER, manifest(3, metadata_uri))
    api.create(SECRETS, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "orders-password"},
                         "data": {"password": base64.b64encode(PASSWORD).decode()}})
    operator = Operator(kube.kubeconfig(tmp_path / "kubeconfig"), tmp_path / "operator.log").start()
    bk = await BookKeeper.connect(metadata_uri)
    try:
        yield api, operator, Logs(bk)
    finally:
        operator.stop()
        await bk.close()


def get(api: Api, name: str = "orders") -> dict | None:
    return api.get(f"{LOGS}/{name}")


async def ready(api: Api, name: str = "orders", reason: Reason = Reason.READY, **status) -> dict:
    """The resource once Ready is True with `reason` and its status has the given values."""
    def check():
        obj = get(api, name)
        st = (obj or {}).get("status") or {}
        c = condition(obj, "Ready")
        return obj if (c.get("status") == "True" and c.get("reason") == reason.value
                       and all(st.get(k) == v for k, v in status.items())) else None
    try:
        return await eventually(check, TIMEOUT, 0.2, f"Ready ({reason.value}) with {status}")
    except AssertionError as e:
        raise AssertionError(f"{e}; status: {(get(api, name) or {}).get('status')}") from None


async def not_ready(api: Api, reason: Reason, name: str = "orders") -> dict:
    def check():
        c = condition(get(api, name), "Ready")
        return c if c.get("status") == "False" and c.get("reason") == reason.value else None
    try:
        return await eventually(check, TIMEOUT, 0.2, f"Ready False ({reason.value})")
    except AssertionError as e:
        raise AssertionError(f"{e}; status: {(get(api, name) or {}).get('status')}") from None


async def fill(logs: Logs, name: str, n: int) -> None:
    """n records, the writer closed (its segment sealed)."""
    async with await logs.open_writer(name, password=PASSWORD) as w:
        await w.append_many([b"record-%d" % i for i in range(n)])


async def test_create_makes_the_log_with_the_spec_config_and_status_follows_it(world):
    api, _, logs = world
    api.create(LOGS, bookielog(retention={"policy": "interest"}))
    obj = await ready(api, segments=0, endOffset=0)
    assert FINALIZER in obj["metadata"]["finalizers"]
    ref = await logs.ref("orders")
    assert ref.config == LogConfig(rollover=Rollover(max_records=10), retention=Retention(RetentionPolicy.INTEREST))
    assert obj["status"]["logId"] == ref.log_id and obj["status"]["logName"] == "orders"

    w = await logs.open_writer("orders", password=PASSWORD)
    try:
        await w.append_many([b"r%d" % i for i in range(25)])
        await logs.commit("orders", "billing", 5)
        obj = await ready(api, endOffset=25, writer=w.options.name, epoch=1)
        assert obj["status"]["cursors"] == [{"name": "billing", "offset": 5, "lag": 20}]
        assert obj["status"]["replication"] == {"ensemble": 3, "writeQuorum": 3, "ackQuorum": 2}
    finally:
        await w.close()
    obj = await ready(api, writer="", endOffset=25)
    assert obj["status"]["segments"] == len((await logs.describe("orders")).segments)
    assert obj["status"]["startOffset"] == 0   # interest: the cursor at 5 keeps segment 0..9


async def test_retention_change_takes_effect(world):
    api, _, logs = world
    api.create(LOGS, bookielog())
    await ready(api)
    await fill(logs, "orders", 45)
    await ready(api, endOffset=45)
    assert (await logs.start_offset("orders")) == 0
    api.patch(f"{LOGS}/orders", {"spec": {"retention": {"policy": "limits", "maxBytes": 0}}})
    obj = await eventually(lambda: (o := get(api)) and (o.get("status") or {}).get("startOffset", 0) > 0 and o,
                           TIMEOUT, 0.2, "the start offset to move")
    start = await logs.start_offset("orders")
    assert obj["status"]["startOffset"] == start and start >= 40   # every closed segment went
    assert (await logs.ref("orders")).config.retention == Retention(RetentionPolicy.LIMITS, max_bytes=0)
    async with await logs.open_reader("orders", start="earliest", end="latest") as r:
        assert [rec.payload async for rec in r] == [b"record-%d" % i for i in range(start, 45)]


async def test_replication_change_applies_to_new_segments_and_says_so(world):
    api, _, logs = world
    api.create(LOGS, bookielog())
    await ready(api)
    w = await logs.open_writer("orders", password=PASSWORD)
    try:
        await w.append(b"before")
        await ready(api, replication={"ensemble": 3, "writeQuorum": 3, "ackQuorum": 2})
        api.patch(f"{LOGS}/orders", {"spec": {"replication": {"ensemble": 3, "writeQuorum": 2, "ackQuorum": 2}}})
        obj = await ready(api, reason=Reason.REPLICATION_PENDING)
        message = condition(obj, "Ready")["message"]
        assert "writers opened from now on" in message and "keeps its configuration until it reopens" in message
        assert (await logs.ref("orders")).config.write_quorum == 2
    finally:
        await w.close()
    async with await logs.open_writer("orders", password=PASSWORD) as w:
        await w.append(b"after")
        await ready(api, replication={"ensemble": 3, "writeQuorum": 2, "ackQuorum": 2})


async def test_delete_with_retain_keeps_the_log(world):
    api, _, logs = world
    api.create(LOGS, bookielog())
    await ready(api)
    await fill(logs, "orders", 12)
    assert api.delete(f"{LOGS}/orders") == 200
    await eventually(lambda: get(api) is None, TIMEOUT, 0.2, "the BookieLog gone")
    assert await logs.end_offset("orders") == 12


async def test_delete_with_delete_removes_the_log(world):
    api, _, logs = world
    api.create(LOGS, bookielog(deletionPolicy="Delete"))
    await ready(api)
    await fill(logs, "orders", 12)
    assert api.delete(f"{LOGS}/orders") == 200
    await eventually(lambda: get(api) is None, TIMEOUT, 0.2, "the BookieLog gone")
    with pytest.raises(LogNotFoundError):
        await logs.ref("orders")


async def test_bad_spec_is_not_ready_with_a_clear_reason_and_no_retry_loop(world):
    api, operator, logs = world
    api.create(LOGS, bookielog(replication={"ensemble": 3, "writeQuorum": 2, "ackQuorum": 3}))
    c = await not_ready(api, Reason.INVALID_SPEC)
    assert "spec.replication.ackQuorum (3) must be <= writeQuorum (2)" in c["message"]
    assert await logs.list() == []
    # no spin: between refresh timer runs it looks (and logs the problem) about once each
    timers = len(operator.lines("Timer 'refresh_log' succeeded"))
    errors = len(operator.lines("is not ready (InvalidSpec)"))
    await eventually(lambda: len(operator.lines("Timer 'refresh_log' succeeded")) >= timers + 3, TIMEOUT, 0.2,
                     "three refresh timer runs")
    assert len(operator.lines("is not ready (InvalidSpec)")) - errors <= 4
    # a missing Secret names the Secret; creating it makes the log
    api.patch(f"{LOGS}/orders", {"spec": {"replication": {"ackQuorum": 2},
                                          "passwordSecretRef": {"name": "other-password"}}})
    c = await not_ready(api, Reason.SECRET_NOT_FOUND)
    assert "'other-password'" in c["message"]
    api.create(SECRETS, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "other-password"},
                         "data": {"password": base64.b64encode(PASSWORD).decode()}})
    await ready(api)


async def test_a_log_made_outside_is_adopted_only_when_the_spec_matches(world):
    api, _, logs = world
    await logs.create("orders", LogConfig(rollover=Rollover(max_records=20)), password=PASSWORD)
    await logs.create("untouched", LogConfig(retention=Retention(RetentionPolicy.LIMITS, max_bytes=0)),
                      password=PASSWORD)
    await fill(logs, "orders", 30)
    api.create(LOGS, bookielog(deletionPolicy="Delete"))
    c = await not_ready(api, Reason.CONFIG_CONFLICT)
    assert "rollover.maxRecords: 20 -> 10" in c["message"]
    assert (await logs.ref("orders")).config.rollover.max_records == 20      # not changed
    # not adopted: deleting the resource leaves the log alone, whatever its deletionPolicy
    assert api.delete(f"{LOGS}/orders") == 200
    await eventually(lambda: get(api) is None, TIMEOUT, 0.2, "the BookieLog gone")
    assert await logs.end_offset("orders") == 30
    # a spec equal to the log's configuration adopts it; from then on the spec is applied
    api.create(LOGS, bookielog(rollover={"maxRecords": 20}))
    obj = await ready(api, endOffset=30)
    assert obj["status"]["logId"] == (await logs.ref("orders")).log_id
    api.patch(f"{LOGS}/orders", {"spec": {"rollover": {"maxRecords": 50}}})
    await eventually(lambda: _max_records(logs, "orders", 50), TIMEOUT, 0.2, "rollover.maxRecords 50 stored")
    assert (await logs.ref("untouched")).config.retention.policy is RetentionPolicy.LIMITS
    assert await logs.list() == ["orders", "untouched"]


async def _max_records(logs: Logs, name: str, n: int) -> bool:
    return (await logs.ref(name)).config.rollover.max_records == n


async def test_operator_killed_while_a_delete_waits_for_the_writer_finishes_it(world):
    api, operator, logs = world
    api.create(LOGS, bookielog(deletionPolicy="Delete"))
    await ready(api)
    w = await logs.open_writer("orders", password=PASSWORD)
    await w.append(b"still writing")
    assert api.delete(f"{LOGS}/orders") == 200
    c = await not_ready(api, Reason.LOG_IN_USE)
    assert "waits for its writer" in c["message"]
    assert await logs.end_offset("orders") == 1
    operator.proc.kill()
    await w.close()
    operator.start()
    await eventually(lambda: get(api) is None, TIMEOUT, 0.2, "the BookieLog gone")
    with pytest.raises(LogNotFoundError):
        await logs.ref("orders")


async def test_spec_changed_while_the_operator_is_down_is_applied_on_restart(world):
    api, operator, logs = world
    api.create(LOGS, bookielog())
    await ready(api)
    operator.proc.kill()
    api.patch(f"{LOGS}/orders", {"spec": {"retention": {"policy": "limits", "maxAge": "7d"}}})
    resumed = len(operator.lines("Handler 'on_log_resume' succeeded"))
    operator.start()
    await eventually(lambda: len(operator.lines("Handler 'on_log_resume' succeeded")) > resumed, TIMEOUT, 0.2,
                     "the restarted operator to resume")
    await eventually(lambda: _retention(logs, Retention(RetentionPolicy.LIMITS, max_age=7 * 86400.0)), TIMEOUT, 0.2,
                     "the new retention stored")
    assert len(operator.lines("reconfigured log 'orders'")) == 1


async def _retention(logs: Logs, want: Retention) -> bool:
    return (await logs.ref("orders")).config.retention == want
