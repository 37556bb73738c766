"""kopf handlers: BookieCluster objects realised on Kubernetes through the pure controller.

Every handler runs the same reconcile: observe (StatefulSet, pods, PVCs, etcd), `plan`, carry
out the actions, write status. Nothing is remembered between runs, so an operator restart in
the middle of a scale-down resumes from what it observes. Waiting (a drain in progress, a
bookie restarting) is not an error: the refresh timer looks again. Failures that may pass
(API conflicts, etcd unreachable) raise `kopf.TemporaryError` with a delay: never a spin.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

import kopf

from pybk.cluster import metadata as meta_side
from pybk.cluster.actions import (CancelDecommission, ClearDecommission, DeletePVCs, EnsureResources,
                                  RestartBookie, ScaleStatefulSet, SetCondition, StartDecommission,
                                  StoreLedgerDefaults,
                                  WaitDecommission)
from pybk.cluster.controller import plan
from pybk.cluster.observed import DecommissionPhase, MetadataObservation, Observed
from pybk.cluster.spec import GROUP, PLURAL, VERSION, BookieClusterSpec, SpecError
from pybk.cluster.status import conditions, now_rfc3339, status as build_status

from pybk.security.settings import ClientSecurity

from . import render
from .kube import KubeApi, KubeError

log = logging.getLogger(__name__)

RETRY_DELAY = 15.0
METADATA_TIMEOUT = 10.0


class Stores:
    """One MetadataStore per metadata URI, connected on first use and kept."""

    def __init__(self) -> None:
        self._stores: dict[str, Any] = {}

    async def get(self, uri: str):
        store = self._stores.get(uri)
        if store is None:
            from pybk.meta import MetadataStore

            store = await asyncio.wait_for(MetadataStore.connect(uri), METADATA_TIMEOUT)
            self._stores[uri] = store
        return store

    async def drop(self, uri: str) -> None:
        store = self._stores.pop(uri, None)
        if store is not None:
            try:
                await store.close()
            except Exception:  # noqa: BLE001 - closing a broken store must not hide the first error
                log.debug("closing the metadata store of %s failed", uri, exc_info=True)

    async def close(self) -> None:
        for uri in list(self._stores):
            await self.drop(uri)


@dataclass
class OperatorContext:
    """What the handlers work with; `main` fills it at start-up, tests put a recorder in."""
    kube: KubeApi
    default_metadata_uri: str | None = None
    security: ClientSecurity | None = None  # what it presents to autorecovery (None: the environment's)
    stores: Stores = field(default_factory=Stores)
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)

    def metadata_uri(self, spec: BookieClusterSpec) -> str | None:
        """The cluster's own metadata service, else the operator's default."""
        return spec.metadata_service_uri or self.default_metadata_uri


CONTEXT: OperatorContext | None = None


def _cluster_of(body: dict[str, Any]) -> tuple[OperatorContext, BookieClusterSpec, str | None]:
    """(context, spec, metadata URI) for timers and clean-up, which act only on a known URI."""
    ctx = _ctx()
    spec = BookieClusterSpec.from_manifest(body, validate=False)
    return ctx, spec, ctx.metadata_uri(spec)


def _ctx() -> OperatorContext:
    if CONTEXT is None:
        raise kopf.TemporaryError("the operator is still starting", delay=5)
    return CONTEXT


def _owner(body: dict[str, Any]) -> dict[str, Any]:
    m = body["metadata"]
    return {"apiVersion": body.get("apiVersion", f"{GROUP}/{VERSION}"),
            "kind": body.get("kind", "BookieCluster"), "name": m["name"], "uid": m["uid"]}


def _ordinal(name: str, prefix: str) -> int | None:
    tail = name[len(prefix):] if name.startswith(prefix) else ""
    return int(tail) if tail.isdigit() else None


def _pod_ready(pod: dict[str, Any]) -> bool:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return c.get("status") == "True"
    return False


async def _observe(ctx: OperatorContext, spec: BookieClusterSpec, uri: str | None
                   ) -> tuple[Observed, dict[str, Any], dict[int, dict]]:
    """Observed state from the API server and etcd; also the pods by ordinal and the store."""
    kube, ns = ctx.kube, spec.namespace
    sts = await kube.get("apps/v1", "StatefulSet", spec.name, ns)
    sel = render.selector_string(spec)
    pods = {o: p for p in await kube.list("v1", "Pod", ns, sel)
            if (o := _ordinal(p["metadata"]["name"], spec.name + "-")) is not None}
    pvc_ordinals: set[int] = set()
    for pvc in await kube.list("v1", "PersistentVolumeClaim", ns, sel):
        for prefix in (f"journal-{spec.name}-", f"ledgers-{spec.name}-"):
            if (o := _ordinal(pvc["metadata"]["name"], prefix)) is not None:
                pvc_ordinals.add(o)
    replicas = int((sts or {}).get("spec", {}).get("replicas") or 0)
    ordinals = set(range(replicas)) | set(pods) | pvc_ordinals
    ids = {o: render.bookie_id(spec, o) for o in ordinals}

    meta_obs: MetadataObservation | None = None
    by_id: dict[str, meta_side.BookieMetadata] = {}
    extra: dict[str, Any] = {"store": None}
    if uri:
        try:
            store = await ctx.stores.get(uri)
            removed = [ids[o] for o in pvc_ordinals if o >= replicas and o not in pods]
            need_ensemble, check_in_use = meta_side.ledger_checks(spec, replicas, removed)
            meta_obs, by_id = await asyncio.wait_for(
                meta_side.observe(store, ids.values(), need_ensemble=need_ensemble, check_in_use=check_in_use),
                METADATA_TIMEOUT)
            extra["store"] = store
        except Exception as e:  # noqa: BLE001 - any etcd failure means "metadata unknown"
            log.warning("metadata service %s unavailable: %s", uri, e)
            await ctx.stores.drop(uri)
            meta_obs = None
    bookies = {}
    for o in sorted(ordinals):
        pod = pods.get(o)
        m = by_id.get(ids[o], meta_side.BookieMetadata())
        bookies[o] = m.observation(
            o, ids[o], pod_exists=pod is not None, pod_ready=pod is not None and _pod_ready(pod),
            pod_terminating=bool(pod and pod["metadata"].get("deletionTimestamp")),
            config_hash=((pod or {}).get("metadata", {}).get("annotations") or {}).get(render.CONFIG_HASH),
            has_volumes=o in pvc_ordinals)
        extra.setdefault("http", {})[ids[o]] = m.http
    annotations = ((sts or {}).get("metadata") or {}).get("annotations") or {}
    applied_hash = annotations.get(render.RESOURCES_HASH)
    if sts is not None:
        for api_version, kind, name in render.companions(spec):
            if await kube.get(api_version, kind, name, ns) is None:
                log.warning("%s/%s: %s %s is missing; applying everything again", ns, spec.name, kind, name)
                applied_hash = None
                break
    observed = Observed(resources_exist=sts is not None,
                        resources_hash=applied_hash,
                        replicas=replicas, bookies=bookies, metadata=meta_obs)
    return observed, extra, pods


async def label_pod_zone(kube: KubeApi, pod: dict[str, Any]) -> str | None:
    """Copy a scheduled bookie pod's node zone onto the pod (`pybk.io/zone`), once; the bookie
    entrypoint waits for it. The node label comes from the pod's `pybk.io/zone-topology-key`."""
    meta = pod.get("metadata") or {}
    ann = meta.get("annotations") or {}
    key = ann.get(render.ZONE_KEY_ANNOTATION)
    node = (pod.get("spec") or {}).get("nodeName")
    if not key or not node or render.ZONE_ANNOTATION in ann or meta.get("deletionTimestamp"):
        return None
    node_obj = await kube.get("v1", "Node", node)
    zone = ((node_obj or {}).get("metadata", {}).get("labels") or {}).get(key) or ""
    await kube.patch("v1", "Pod", meta["name"], meta.get("namespace"),
                     {"metadata": {"annotations": {render.ZONE_ANNOTATION: zone}}})
    return zone


async def _label_zones(ctx: OperatorContext, spec: BookieClusterSpec, pods: dict[int, dict]) -> None:
    """The same for every bookie pod of a cluster (in case a pod event was missed)."""
    for pod in pods.values():
        await label_pod_zone(ctx.kube, pod)


async def _execute(ctx: OperatorContext, spec: BookieClusterSpec, uri: str, body: dict[str, Any],
                   observed: Observed, extra: dict[str, Any], actions: list) -> None:
    kube, ns, store = ctx.kube, spec.namespace, extra.get("store")
    for a in actions:
        if isinstance(a, EnsureResources):
            replicas = observed.replicas if observed.resources_exist else a.replicas
            for obj in render.render(spec, uri, replicas=replicas, owner=_owner(body)):
                await kube.apply(obj)
        elif isinstance(a, ScaleStatefulSet):
            await kube.patch("apps/v1", "StatefulSet", spec.name, ns, {"spec": {"replicas": a.replicas}})
        elif isinstance(a, StartDecommission):
            await meta_side.start_decommission(store, a.bookie_id, retry=a.retry)
        elif isinstance(a, CancelDecommission):
            await meta_side.cancel_decommission(store, a.bookie_id, extra.get("http", {}).get(a.bookie_id))
        elif isinstance(a, ClearDecommission):
            await meta_side.clear_decommission(store, a.bookie_id)
        elif isinstance(a, DeletePVCs):
            for name in render.pvc_names(spec, a.ordinal):
                await kube.delete("v1", "PersistentVolumeClaim", name, ns)
            # its data is gone for good: drop its cookie too, or a new bookie in this slot would
            # be refused as "wiped" by the cookie check
            await meta_side.forget_bookie(store, render.bookie_id(spec, a.ordinal))
        elif isinstance(a, RestartBookie):
            await kube.delete("v1", "Pod", render.pod_name(spec, a.ordinal), ns)
        elif isinstance(a, StoreLedgerDefaults):
            await meta_side.store_ledger_defaults(store, a.defaults)
        elif isinstance(a, (WaitDecommission, SetCondition)):
            pass


def _invalid_status(body: dict[str, Any], errors: list[str]) -> dict[str, Any]:
    gen = int(body["metadata"].get("generation") or 0)
    msg = "; ".join(errors)
    return {"observedGeneration": gen, "conditions": conditions(
        [SetCondition("Ready", False, "InvalidSpec", msg),
         SetCondition("Progressing", False, "InvalidSpec", "fix the spec to continue"),
         SetCondition("Decommissioning", False, "NoDecommission"),
         SetCondition("Degraded", True, "InvalidSpec", msg)],
        (body.get("status") or {}).get("conditions"), gen)}


def _failed_status(body: dict[str, Any], reason: str, message: str) -> dict[str, Any]:
    """Keep the other conditions, set Degraded with why the last reconcile failed."""
    gen = int(body["metadata"].get("generation") or 0)
    old = [c for c in (body.get("status") or {}).get("conditions") or [] if c.get("type") != "Degraded"]
    degraded = conditions([SetCondition("Degraded", True, reason, message)],
                          (body.get("status") or {}).get("conditions"), gen)
    return {"conditions": old + degraded}


async def reconcile(body: dict[str, Any], patch: dict[str, Any], logger: logging.Logger | Any = log
                    ) -> list:
    """Observe, plan, act, and put the new status into `patch`. Returns the planned actions."""
    ctx = _ctx()
    body = dict(body)
    uid = body["metadata"].get("uid", body["metadata"]["name"])
    lock = ctx.locks.setdefault(uid, asyncio.Lock())
    async with lock:
        try:
            spec = BookieClusterSpec.from_manifest(body, validate=False)
        except SpecError as e:
            patch["status"] = _invalid_status(body, e.errors)
            logger.error("BookieCluster %s is invalid: %s", body["metadata"]["name"], e)
            return []
        uri = ctx.metadata_uri(spec)
        errors = spec.problems()
        if not uri:
            errors.append("spec.metadataServiceUri is empty and the operator has no --default-metadata-uri")
        if errors:
            patch["status"] = _invalid_status(body, errors)
            logger.error("BookieCluster %s is invalid: %s", spec.name, "; ".join(errors))
            return []
        try:
            observed, extra, pods = await _observe(ctx, spec, uri)
            actions = plan(spec, observed)
            await _execute(ctx, spec, uri, body, observed, extra, actions)
            await _label_zones(ctx, spec, pods)
        except KubeError as e:
            patch["status"] = _failed_status(body, "KubernetesApiError", str(e))
            if e.transient:
                raise kopf.TemporaryError(str(e), delay=RETRY_DELAY) from e
            raise kopf.PermanentError(str(e)) from e
        except Exception as e:  # noqa: BLE001 - etcd/decommission failures: retry later, do not spin
            logger.exception("reconcile of %s failed; retrying in %.0fs", spec.name, RETRY_DELAY)
            await ctx.stores.drop(uri)
            patch["status"] = _failed_status(body, "ReconcileFailed", f"{type(e).__name__}: {e}")
            raise kopf.TemporaryError(f"{type(e).__name__}: {e}", delay=RETRY_DELAY) from e
        st = build_status(observed, actions, body.get("status"), spec.generation,
                          selector=render.selector_string(spec))
        patch["status"] = st
        for a in actions:
            if not isinstance(a, SetCondition):
                logger.info("%s/%s: %s", spec.namespace, spec.name, a)
        return actions


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    """Keep kopf's own bookkeeping in annotations: the CRD's status schema has no room for it."""
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration")
    settings.posting.level = logging.WARNING


@kopf.on.create(GROUP, VERSION, PLURAL)
async def on_create(body, patch, logger, **_: Any) -> None:
    """A new cluster: create its objects."""
    await reconcile(body, patch, logger)


@kopf.on.update(GROUP, VERSION, PLURAL)
async def on_update(body, patch, logger, old=None, new=None, **_: Any) -> None:
    """Spec changed (replicas, also via the scale subresource; config, image, resources, ...):
    one reconcile scales, re-renders, or rolls bookies. The only update handler: a second one
    (say for spec.replicas) would reconcile the same change twice."""
    replicas = [((o or {}).get("spec") or {}).get("replicas") for o in (old, new)]
    if replicas[0] != replicas[1]:
        logger.info("replicas %s -> %s", *replicas)
    await reconcile(body, patch, logger)


@kopf.on.resume(GROUP, VERSION, PLURAL)
async def on_resume(body, patch, logger, **_: Any) -> None:
    """Operator (re)started: continue whatever the cluster is in the middle of."""
    await reconcile(body, patch, logger)


async def refresh(body, patch, logger, **_: Any) -> None:
    """Status from etcd (writable/readonly bookies, under-replication) and the next step of any
    scale-down or rolling restart in progress."""
    await reconcile(body, patch, logger)


@kopf.on.event("", "v1", "pods", labels={render.CLUSTER_LABEL: kopf.PRESENT,
                                          "app.kubernetes.io/component": "bookie"})
async def on_bookie_pod(body, logger, **_: Any) -> None:
    """A bookie pod was scheduled: give it its zone at once (its entrypoint is waiting)."""
    try:
        zone = await label_pod_zone(_ctx().kube, body)
    except KubeError as e:
        logger.warning("could not label the zone of pod %s: %s", body["metadata"]["name"], e)
        return
    if zone is not None:
        logger.info("pod %s is in zone %r", body["metadata"]["name"], zone)


async def audit(body, patch, logger, **_: Any) -> None:
    """Ask the cluster's elected auditor to check every ledger now, and record when it agreed.
    No auditor (autorecovery down or scaled to 0) is a warning, not an error to retry."""
    from pybk.recovery import admin

    ctx, spec, uri = _cluster_of(body)
    if not uri:
        return
    try:
        store = await ctx.stores.get(uri)
        answer = await admin.trigger_audit(store, security=ctx.security)
    except admin.AdminError as e:
        logger.warning("no audit of %s triggered: %s", spec.name, e)
        return
    except Exception as e:  # noqa: BLE001 - etcd trouble: the next interval tries again
        await ctx.stores.drop(uri)
        logger.warning("no audit of %s triggered: metadata service %s: %s", spec.name, uri, e)
        return
    logger.info("audit of %s triggered on %s", spec.name, answer.get("auditor", "the auditor"))
    patch["status"] = {"lastAudit": now_rfc3339()}


@kopf.on.delete(GROUP, VERSION, PLURAL, optional=True)
async def on_delete(body, logger, **_: Any) -> None:
    """Owned objects go with the cluster (owner references); forget finished drain records."""
    ctx, spec, uri = _cluster_of(body)
    if not uri:
        return
    try:
        store = await ctx.stores.get(uri)
        for o in range(int((body.get("status") or {}).get("replicas") or spec.replicas) + 1):
            bid = render.bookie_id(spec, o)
            phase, _, _ = meta_side.decommission_phase(await store.decommission.get(bid))
            if phase is DecommissionPhase.DONE:
                await meta_side.clear_decommission(store, bid)
    except Exception as e:  # noqa: BLE001 - deletion must never be blocked by etcd
        logger.warning("could not clean drain records of %s: %s", spec.name, e)


def register_timers(registry: kopf.OperatorRegistry, refresh_interval: float, audit_interval: float) -> None:
    """Register the refresh and audit timers with the operator's intervals (its settings, loaded at
    start-up): `refresh` every refresh_interval, `audit` every audit_interval."""
    kopf.timer(GROUP, VERSION, PLURAL, interval=refresh_interval, initial_delay=refresh_interval,
               registry=registry)(refresh)
    kopf.timer(GROUP, VERSION, PLURAL, interval=audit_interval, initial_delay=60, registry=registry)(audit)
