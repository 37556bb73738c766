"""kopf handlers: BookieLog objects realised through the pure log controller.

Each run observes (the BookieCluster for its metadata URI, the password Secret, other BookieLogs
naming the same log, the log in etcd and on the bookies), plans (`pybk.cluster.bookielog.
controller`), carries the actions out with a BookKeeper client of the cluster (the operator's own
credentials, as for BookieClusters), looks again, and writes status. The only memory is the
status's `logId`: the log this resource created or adopted, the only one it ever changes.
Problems a person must fix are reported in the Ready condition and looked at again by the
refresh timer, never retried in a loop; failures that may pass raise `kopf.TemporaryError`.
"""
from __future__ import annotations

import asyncio
import base64
import logging
import time
from typing import Any

import kopf

from pybk.cluster.bookielog import store as log_store
from pybk.cluster.bookielog.actions import SetCondition
from pybk.cluster.bookielog.controller import NEEDS_A_PERSON, Reason, deletion_note, plan, plan_delete, ready
from pybk.cluster.bookielog.observed import ClusterState, Observed, SecretState
from pybk.cluster.bookielog.spec import API_VERSION, GROUP, PLURAL, VERSION, BookieLogSpec
from pybk.cluster.bookielog.status import status as build_status
from pybk.cluster.spec import BookieClusterSpec
from pybk.cluster.spec import KIND as CLUSTER_KIND

from . import handlers
from .kube import KubeApi, KubeError

log = logging.getLogger(__name__)

RETRY_DELAY = 15.0      # a wait (a writer holds the log, etcd does not answer) looked at again this soon
LOG_TIMEOUT = 30.0      # one look at a log (etcd reads, the open segment's LAC from its bookies)


class Clients:
    """One BookKeeper client per metadata URI, connected on first use and kept."""

    def __init__(self) -> None:
        self._clients: dict[str, Any] = {}

    async def get(self, uri: str):
        bk = self._clients.get(uri)
        if bk is None:
            from pybk.client import BookKeeper

            bk = await asyncio.wait_for(BookKeeper.connect(uri), handlers.METADATA_TIMEOUT)
            self._clients[uri] = bk
        return bk

    async def drop(self, uri: str) -> None:
        bk = self._clients.pop(uri, None)
        if bk is not None:
            try:
                await bk.close()
            except Exception:  # noqa: BLE001 - closing a broken client must not hide the first error
                log.debug("closing the client of %s failed", uri, exc_info=True)

    async def close(self) -> None:
        for uri in list(self._clients):
            await self.drop(uri)


CLIENTS = Clients()


async def read_password(kube: KubeApi, spec: BookieLogSpec) -> tuple[SecretState, bytes | None]:
    """The log's password from its Secret (read when needed, never stored or logged)."""
    ref = spec.password_secret
    secret = await kube.get("v1", "Secret", ref.name, spec.namespace)
    if secret is None:
        return SecretState.ABSENT, None
    data = secret.get("data") or {}
    if ref.key not in data:
        return SecretState.KEY_MISSING, None
    return SecretState.PRESENT, base64.b64decode(data[ref.key])


async def cluster_uri(ctx: handlers.OperatorContext, spec: BookieLogSpec) -> tuple[ClusterState, str | None]:
    """Whether the named BookieCluster exists (or is being deleted) and its metadata service URI."""
    body = await ctx.kube.get(API_VERSION, CLUSTER_KIND, spec.cluster, spec.namespace)
    if body is None:
        return ClusterState.ABSENT, None
    state = ClusterState.DELETING if body["metadata"].get("deletionTimestamp") else ClusterState.PRESENT
    return state, ctx.metadata_uri(BookieClusterSpec.from_manifest(body, validate=False))


def claimant(spec: BookieLogSpec, created: str, others: list[dict[str, Any]], log_id: int | None) -> str | None:
    """Another BookieLog of the same cluster naming the same log that has it first: it manages the
    log's current id, or neither manages it and the other is older (then name order breaks ties)."""
    for o in others:
        m = o.get("metadata") or {}
        if m.get("uid") == spec.uid or m.get("deletionTimestamp"):
            continue
        try:
            other = BookieLogSpec.from_manifest(o, validate=False)
        except Exception:  # noqa: BLE001 - a malformed neighbour claims nothing
            continue
        if other.cluster != spec.cluster or other.log != spec.log:
            continue
        theirs = (o.get("status") or {}).get("logId")
        if theirs is not None and theirs == log_id:
            return other.name
        if theirs is None and (m.get("creationTimestamp") or "", other.name) < (created, spec.name):
            return other.name
    return None


async def observe(ctx: handlers.OperatorContext, body: dict[str, Any], spec: BookieLogSpec,
                  managed: int | None) -> tuple[Observed, bytes | None, str | None]:
    """(what `plan` looks at, the password, the metadata URI)."""
    now = int(time.time() * 1000)
    cluster, uri = await cluster_uri(ctx, spec)
    secret, password = await read_password(ctx.kube, spec)
    if cluster is ClusterState.ABSENT or not uri:
        return Observed(cluster=ClusterState.ABSENT, secret=secret, managed_id=managed, now_ms=now), password, None
    try:
        bk = await CLIENTS.get(uri)
        from pybk.log import Logs

        found = await asyncio.wait_for(log_store.observe_log(Logs(bk), spec.log, password), LOG_TIMEOUT)
    except Exception as e:  # noqa: BLE001 - any etcd or bookie failure means "the log is unknown"
        await CLIENTS.drop(uri)
        return Observed(cluster=cluster, secret=secret, metadata_error=f"{type(e).__name__}: {e}",
                        managed_id=managed, now_ms=now), password, uri
    claimed = None
    if managed is None and found is not None:
        others = await ctx.kube.list(API_VERSION, "BookieLog", spec.namespace, "")
        claimed = claimant(spec, body["metadata"].get("creationTimestamp") or "", others, found.log_id)
    return Observed(cluster=cluster, secret=secret, log=found, managed_id=managed, claimed_by=claimed,
                    now_ms=now), password, uri


def _failed_status(body: dict[str, Any], spec: BookieLogSpec, message: str) -> dict[str, Any]:
    from pybk.cluster.status import conditions

    return {"conditions": conditions([ready(False, Reason.RECONCILE_FAILED, message)],
                                     (body.get("status") or {}).get("conditions"), spec.generation)}


async def reconcile(body: dict[str, Any], patch: dict[str, Any], logger: logging.Logger | Any = log) -> list:
    """Observe, plan, act, look again, and put the new status into `patch`. Returns the actions taken."""
    ctx = handlers._ctx()
    body = dict(body)
    uid = body["metadata"].get("uid", body["metadata"]["name"])
    async with ctx.locks.setdefault(f"bookielog/{uid}", asyncio.Lock()):
        spec = BookieLogSpec.from_manifest(body, validate=False)
        old_status = body.get("status") or {}
        managed = old_status.get("logId")
        uri = None
        try:
            observed, password, uri = await observe(ctx, body, spec, managed)
            actions = plan(spec, observed)
            final = actions
            steps = [a for a in actions if not isinstance(a, SetCondition)]
            if steps:
                from pybk.log import Logs

                logs = Logs(await CLIENTS.get(uri))
                managed = await log_store.execute(logs, spec, password, steps, managed)
                observed, password, uri = await observe(ctx, body, spec, managed)
                final = plan(spec, observed)
        except KubeError as e:
            patch["status"] = _failed_status(body, spec, str(e))
            if e.transient:
                raise kopf.TemporaryError(str(e), delay=RETRY_DELAY) from e
            raise kopf.PermanentError(str(e)) from e
        except Exception as e:  # noqa: BLE001 - etcd/bookie failures: retry later, do not spin
            logger.exception("reconcile of BookieLog %s failed; retrying in %.0fs", spec.name, RETRY_DELAY)
            if uri:
                await CLIENTS.drop(uri)
            patch["status"] = _failed_status(body, spec, f"{type(e).__name__}: {e}")
            raise kopf.TemporaryError(f"{type(e).__name__}: {e}", delay=RETRY_DELAY) from e
        patch["status"] = build_status(spec, observed, final, old_status, managed)
        cond = next(a for a in final if isinstance(a, SetCondition))
        if Reason(cond.reason) in NEEDS_A_PERSON:
            logger.error("BookieLog %s is not ready (%s): %s", spec.name, cond.reason, cond.message)
        for a in steps:
            logger.info("%s/%s: %s", spec.namespace, spec.name, a)
        return steps


@kopf.on.create(GROUP, VERSION, PLURAL)
async def on_log_create(body, patch, logger, **_: Any) -> None:
    """A new BookieLog: create (or adopt) its log."""
    await reconcile(body, patch, logger)


@kopf.on.update(GROUP, VERSION, PLURAL)
async def on_log_update(body, patch, logger, **_: Any) -> None:
    """The spec changed: store the new configuration (retention, rollover, replication)."""
    await reconcile(body, patch, logger)


@kopf.on.resume(GROUP, VERSION, PLURAL)
async def on_log_resume(body, patch, logger, **_: Any) -> None:
    """Operator (re)started: apply whatever the spec says that the log does not have yet."""
    await reconcile(body, patch, logger)


async def refresh_log(body, patch, logger, **_: Any) -> None:
    """Status from etcd and the bookies (offsets, writer, cursors' lag), and retention enforced."""
    await reconcile(body, patch, logger)


@kopf.on.delete(GROUP, VERSION, PLURAL)
async def on_log_delete(body, patch, logger, **_: Any) -> None:
    """deletionPolicy Retain: the log stays. Delete: the log and its data go (waiting while a writer
    has it open, or etcd does not answer); only ever the log this resource created or adopted."""
    ctx = handlers._ctx()
    body = dict(body)
    spec = BookieLogSpec.from_manifest(body, validate=False)
    managed = (body.get("status") or {}).get("logId")
    observed, password, uri = await observe(ctx, body, spec, managed)
    actions, wait = plan_delete(spec, observed)
    if wait is not None:
        from pybk.cluster.status import conditions

        patch["status"] = {"conditions": conditions([wait], (body.get("status") or {}).get("conditions"),
                                                    spec.generation)}
        raise kopf.TemporaryError(wait.message, delay=RETRY_DELAY)
    if actions:
        from pybk.log import Logs

        try:
            await log_store.execute(Logs(await CLIENTS.get(uri)), spec, password, actions, managed)
        except Exception as e:  # noqa: BLE001 - e.g. a writer opened meanwhile: look again later
            if uri:
                await CLIENTS.drop(uri)
            raise kopf.TemporaryError(f"deleting log {spec.log!r}: {type(e).__name__}: {e}",
                                      delay=RETRY_DELAY) from e
    logger.info("BookieLog %s deleted: %s", spec.name, deletion_note(spec, observed))


@kopf.on.cleanup()
async def close_clients(**_: Any) -> None:
    """The operator stops: close the BookKeeper clients."""
    await CLIENTS.close()


def register_timers(registry: kopf.OperatorRegistry, refresh_interval: float) -> None:
    """Register the BookieLog refresh timer with the operator's refresh interval (its settings,
    loaded at start-up)."""
    kopf.timer(GROUP, VERSION, PLURAL, interval=refresh_interval, initial_delay=refresh_interval,
               registry=registry)(refresh_log)
