"""The BookieLog controller as a pure function: a spec and an observation give the actions and the
Ready condition (docs/kubernetes.md#bookielog-named-logs-as-resources); the manifest parser names
every bad field; the status carries what was observed."""
from __future__ import annotations

from dataclasses import replace

import pytest

from pybk.cluster.bookielog.actions import AdoptLog, CreateLog, DeleteLog, ReconfigureLog, SetCondition, TruncateLog
from pybk.cluster.bookielog.controller import Reason, config_changes, plan, plan_delete
from pybk.cluster.bookielog.observed import ClusterState, LogObservation, Observed, Replication, SecretState
from pybk.cluster.bookielog.spec import BookieLogSpec, DeletionPolicy, SpecError, parse_bytes, parse_duration
from pybk.cluster.bookielog.status import status
from pybk.entry import DigestType
from pybk.log import CursorInfo, LogConfig, Retention, RetentionPolicy, Rollover, Segment, SegmentState

NOW = 10_000_000_000


def manifest(**spec) -> dict:
    return {"apiVersion": "pybk.io/v1alpha1", "kind": "BookieLog",
            "metadata": {"name": "orders", "namespace": "team-a", "generation": 2, "uid": "u1"},
            "spec": {"cluster": "demo", "passwordSecretRef": {"name": "orders-pw"}, **spec}}


def spec_of(**spec) -> BookieLogSpec:
    return BookieLogSpec.from_manifest(manifest(**spec))


def closed(seq: int, first: int, records: int, size: int, max_ts: int = NOW) -> Segment:
    return Segment(seq, 100 + seq, SegmentState.CLOSED, 1, first, records, size, max_ts - 1, max_ts)


def log_obs(config: LogConfig = LogConfig(), **kw) -> LogObservation:
    base = dict(log_id=7, config=config, password_matches=True, epoch=1, end_offset=30,
                segments=(closed(0, 0, 10, 1000), closed(1, 10, 10, 1000),
                          Segment(2, 102, SegmentState.OPEN, 1, 20)),
                open_replication=Replication(3, 3, 2))
    return LogObservation(**{**base, **kw})


def observed(log: LogObservation | None = None, managed: int | None = 7, **kw) -> Observed:
    return Observed(log=log, managed_id=managed, now_ms=NOW, **kw)


def ready_of(actions: list) -> SetCondition:
    (c,) = [a for a in actions if isinstance(a, SetCondition)]
    assert c.type == "Ready"
    return c


# ---- the spec ------------------------------------------------------------------------------------

def test_spec_defaults_are_the_log_library_defaults():
    s = spec_of()
    assert s.log == "orders" and s.cluster == "demo" and s.namespace == "team-a" and s.generation == 2
    assert s.config == LogConfig() and s.deletion_policy is DeletionPolicy.RETAIN
    assert s.password_secret.name == "orders-pw" and s.password_secret.key == "password"


def test_spec_sizes_and_durations_become_the_log_config():
    s = spec_of(logName="team-a/orders", digest="MAC",
                replication={"ensemble": 5, "writeQuorum": 3, "ackQuorum": 2},
                rollover={"maxBytes": "64Mi", "maxRecords": 1000, "maxAge": "1d12h", "maxIdle": "0s"},
                retention={"policy": "limits", "maxAge": "7d", "maxBytes": 10_000})
    assert s.log == "team-a/orders"
    assert s.config == LogConfig(ensemble=5, write_quorum=3, ack_quorum=2, digest=DigestType.MAC,
                                 rollover=Rollover(max_bytes=64 << 20, max_records=1000, max_age=36 * 3600.0,
                                                   max_idle=None),
                                 retention=Retention(RetentionPolicy.LIMITS, max_age=7 * 86400.0, max_bytes=10_000))


@pytest.mark.parametrize("value, expected", [(0, 0), (1024, 1024), ("10Gi", 10 << 30), ("5G", 5 * 10**9),
                                             ("7", 7)])
def test_parse_bytes(value, expected):
    assert parse_bytes(value, "x") == expected


@pytest.mark.parametrize("value, expected", [("4h", 14400.0), ("30m", 1800.0), ("1d12h", 129600.0),
                                             ("500ms", 0.5), ("1.5s", 1.5)])
def test_parse_duration(value, expected):
    assert parse_duration(value, "x") == expected


@pytest.mark.parametrize("spec, message", [
    ({"replication": {"ensemble": 3, "writeQuorum": 2, "ackQuorum": 3}},
     "spec.replication.ackQuorum (3) must be <= writeQuorum (2)"),
    ({"replication": {"ensemble": 2, "writeQuorum": 3, "ackQuorum": 2}},
     "spec.replication.writeQuorum (3) must be <= ensemble (2)"),
    ({"retention": {"policy": "limits"}}, "policy limits needs maxAge or maxBytes"),
    ({"retention": {"policy": "interest", "maxAge": "1d"}}, "maxAge and maxBytes apply only to policy limits"),
    ({"retention": {"policy": "forever"}}, "spec.retention.policy must be none, limits or interest"),
    ({"rollover": {"maxAge": "four hours"}}, "spec.rollover.maxAge must be a duration"),
    ({"rollover": {"maxBytes": "lots"}}, "spec.rollover.maxBytes must be a byte count"),
    ({"deletionPolicy": "Keep"}, "spec.deletionPolicy must be Retain or Delete"),
    ({"passwordSecretRef": None}, "spec.passwordSecretRef.name is required"),
    ({"cluster": None}, "spec.cluster is required"),
    ({"logName": "/bad"}, "spec.logName: bad log name"),
    ({"password": "in-clear"}, "spec.password is not a known field"),
])
def test_spec_errors_name_the_field(spec, message):
    with pytest.raises(SpecError) as e:
        spec_of(**spec)
    assert any(message in err for err in e.value.errors), e.value.errors
    assert any(message in err for err in BookieLogSpec.from_manifest(manifest(**spec), validate=False).errors)


# ---- plan ----------------------------------------------------------------------------------------

def test_no_log_is_created_with_the_spec_config():
    s = spec_of(rollover={"maxRecords": 10})
    actions = plan(s, observed(managed=None))
    assert actions[0] == CreateLog(s.config)
    assert ready_of(actions).reason == Reason.CREATING.value


def test_a_managed_log_deleted_outside_is_created_again_and_said_so():
    actions = plan(spec_of(), observed(managed=7))
    assert isinstance(actions[0], CreateLog)
    assert "deleted outside Kubernetes" in ready_of(actions).message


def test_a_matching_log_is_ready_with_its_offsets():
    actions = plan(spec_of(), observed(log_obs()))
    assert actions == [SetCondition("Ready", True, Reason.READY.value,
                                    "log 'orders' (id 7): offsets 0..30 in 3 segment(s)")]


@pytest.mark.parametrize("obs, reason", [
    (Observed(cluster=ClusterState.ABSENT), Reason.CLUSTER_NOT_FOUND),
    (Observed(cluster=ClusterState.DELETING), Reason.CLUSTER_DELETING),
    (Observed(secret=SecretState.ABSENT), Reason.SECRET_NOT_FOUND),
    (Observed(secret=SecretState.KEY_MISSING), Reason.SECRET_KEY_MISSING),
    (Observed(metadata_error="etcd timed out"), Reason.METADATA_UNAVAILABLE),
])
def test_nothing_is_done_without_cluster_secret_or_etcd(obs, reason):
    actions = plan(spec_of(), obs)
    assert actions == [ready_of(actions)] and ready_of(actions).reason == reason.value
    assert not ready_of(actions).status


def test_an_invalid_spec_is_reported_not_acted_on():
    s = BookieLogSpec.from_manifest(manifest(replication={"ensemble": 1, "writeQuorum": 2}), validate=False)
    actions = plan(s, observed(log_obs()))
    assert len(actions) == 1 and ready_of(actions).reason == Reason.INVALID_SPEC.value
    assert "writeQuorum (2) must be <= ensemble (1)" in ready_of(actions).message


def test_a_changed_spec_is_stored_with_what_changed():
    s = spec_of(retention={"policy": "limits", "maxAge": "1d"}, rollover={"maxRecords": 10})
    actions = plan(s, observed(log_obs()))
    (rc,) = [a for a in actions if isinstance(a, ReconfigureLog)]
    assert rc.config == s.config
    assert rc.changes == ("rollover.maxRecords: None -> 10", "retention.policy: none -> limits",
                          "retention.maxAge: None -> 86400.0")


def test_retention_truncates_what_the_policy_allows():
    s = spec_of(retention={"policy": "limits", "maxBytes": 1500})
    actions = plan(s, observed(log_obs(config=s.config)))
    assert TruncateLog(10) in actions                          # 2000 bytes closed: the oldest 1000 go
    aged = spec_of(retention={"policy": "limits", "maxAge": "1h"})
    old = log_obs(config=aged.config, segments=(closed(0, 0, 10, 1000, NOW - 7200_000),
                                                closed(1, 10, 10, 1000, NOW - 60_000)))
    assert TruncateLog(10) in plan(aged, observed(old))
    interest = spec_of(retention={"policy": "interest"})
    read = log_obs(config=interest.config, cursors=(CursorInfo("billing", 20, 10),))
    assert TruncateLog(20) in plan(interest, observed(read))
    assert not [a for a in plan(interest, observed(replace(read, cursors=()))) if isinstance(a, TruncateLog)]


def test_replication_change_is_pending_until_a_writer_reopens():
    s = spec_of(replication={"ensemble": 3, "writeQuorum": 2, "ackQuorum": 2})
    first = plan(s, observed(log_obs(writer="host:1")))
    assert ReconfigureLog in {type(a) for a in first}
    after = plan(s, observed(log_obs(config=s.config, writer="host:1")))
    c = ready_of(after)
    assert c.status and c.reason == Reason.REPLICATION_PENDING.value
    assert "open segment has ensemble 3, write quorum 3, ack quorum 2" in c.message
    assert "writer 'host:1' keeps its configuration until it reopens" in c.message
    reopened = plan(s, observed(log_obs(config=s.config, open_replication=Replication(3, 2, 2))))
    assert ready_of(reopened).reason == Reason.READY.value


def test_digest_cannot_change():
    s = spec_of(digest="MAC")
    actions = plan(s, observed(log_obs()))
    assert actions == [ready_of(actions)] and ready_of(actions).reason == Reason.DIGEST_IMMUTABLE.value


def test_an_existing_log_is_adopted_only_if_its_config_equals_the_spec():
    s = spec_of(rollover={"maxRecords": 10})
    conflict = plan(s, observed(log_obs(), managed=None))
    assert conflict == [ready_of(conflict)] and ready_of(conflict).reason == Reason.CONFIG_CONFLICT.value
    assert "rollover.maxRecords: None -> 10" in ready_of(conflict).message
    adopted = plan(s, observed(log_obs(config=s.config), managed=None))
    assert adopted[0] == AdoptLog(7) and ready_of(adopted).status


def test_a_wrong_password_changes_nothing():
    for managed in (None, 7):
        actions = plan(spec_of(retention={"policy": "interest"}), observed(log_obs(password_matches=False),
                                                                           managed=managed))
        assert actions == [ready_of(actions)] and ready_of(actions).reason == Reason.PASSWORD_MISMATCH.value


def test_a_log_recreated_outside_is_left_alone():
    actions = plan(spec_of(retention={"policy": "interest"}), observed(log_obs(log_id=9), managed=7))
    assert actions == [ready_of(actions)] and ready_of(actions).reason == Reason.LOG_REPLACED.value


def test_a_log_another_resource_claims_is_not_adopted():
    actions = plan(spec_of(), observed(log_obs(), managed=None, claimed_by="orders-old"))
    assert ready_of(actions).reason == Reason.NAME_CLAIMED.value and "orders-old" in ready_of(actions).message


def test_config_changes_lists_nothing_for_equal_configs():
    assert config_changes(LogConfig(), LogConfig()) == ()


# ---- deletion ------------------------------------------------------------------------------------

def test_retain_deletes_nothing():
    assert plan_delete(spec_of(), observed(log_obs())) == ([], None)


def test_delete_deletes_only_the_managed_log():
    s = spec_of(deletionPolicy="Delete")
    assert plan_delete(s, observed(log_obs())) == ([DeleteLog(7)], None)
    assert plan_delete(s, observed(log_obs(), managed=None)) == ([], None)          # never ours
    assert plan_delete(s, observed(log_obs(log_id=9))) == ([], None)                # someone else's now
    assert plan_delete(s, observed(None)) == ([], None)                             # gone already
    assert plan_delete(s, observed(log_obs(), cluster=ClusterState.ABSENT)) == ([], None)


def test_delete_waits_for_the_writer_and_for_etcd():
    s = spec_of(deletionPolicy="Delete")
    actions, wait = plan_delete(s, observed(log_obs(writer="host:1")))
    assert actions == [] and wait.reason == Reason.LOG_IN_USE.value and "'host:1'" in wait.message
    actions, wait = plan_delete(s, observed(metadata_error="etcd timed out"))
    assert actions == [] and wait.reason == Reason.METADATA_UNAVAILABLE.value


def test_delete_without_the_password_uses_the_admin_role():
    s = spec_of(deletionPolicy="Delete")
    assert plan_delete(s, observed(log_obs(), secret=SecretState.ABSENT)) == ([DeleteLog(7, force=True)], None)
    assert plan_delete(s, observed(log_obs(password_matches=False))) == ([DeleteLog(7, force=True)], None)


# ---- status --------------------------------------------------------------------------------------

def test_status_reports_the_observed_log():
    s = spec_of()
    obs = observed(log_obs(writer="host:1", cursors=(CursorInfo("billing", 25, 5),), start_offset=0))
    st = status(s, obs, plan(s, obs), None, 7, now="2026-01-01T00:00:00Z")
    assert st == {"observedGeneration": 2, "logName": "orders", "logId": 7, "startOffset": 0, "endOffset": 30,
                  "segments": 3, "bytes": 2000, "epoch": 1, "writer": "host:1",
                  "cursors": [{"name": "billing", "offset": 25, "lag": 5}],
                  "replication": {"ensemble": 3, "writeQuorum": 3, "ackQuorum": 2},
                  "conditions": [{"type": "Ready", "status": "True", "reason": "Ready",
                                  "message": "log 'orders' (id 7): offsets 0..30 in 3 segment(s)",
                                  "observedGeneration": 2, "lastTransitionTime": "2026-01-01T00:00:00Z"}]}


def test_status_keeps_the_last_known_figures_while_the_log_cannot_be_read():
    s = spec_of()
    old = {"startOffset": 5, "endOffset": 30, "segments": 3, "logId": 7}
    st = status(s, Observed(metadata_error="etcd timed out"), plan(s, Observed(metadata_error="x")), old, 7)
    assert st["startOffset"] == 5 and st["endOffset"] == 30 and st["logId"] == 7
    assert st["conditions"][0]["reason"] == Reason.METADATA_UNAVAILABLE.value
