"""The etcd side of cluster control, shared by both platforms: what the metadata says about a
cluster's bookies, and the decommission requests the controller asks for.

Everything goes through a `pybk.meta.MetadataStore` (registry, decommission records,
under-replication markers, ledger metadata) passed in by the platform, `pybk.recovery.decommission`
to start drains, and the bookies' admin HTTP API to make a bookie writable again.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Iterable

from pybk.meta.cluster import LedgerDefaults
from pybk.meta.decommission import DONE, FAILED, Decommission

from .observed import BookieObservation, DecommissionPhase, MetadataObservation, Registration
from .spec import BookieClusterSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BookieMetadata:
    """What etcd says about one bookie."""
    registration: Registration = Registration.ABSENT
    decommission: DecommissionPhase = DecommissionPhase.NONE
    ledgers_left: int | None = None
    message: str = ""
    http: str | None = None
    in_use: bool | None = None

    def observation(self, ordinal: int, bookie_id: str, **platform: Any) -> BookieObservation:
        """The controller's view of one bookie slot: what the platform saw of it (`platform`:
        pod_exists, pod_ready, config_hash, has_volumes, ...) and what etcd says."""
        return BookieObservation(ordinal=ordinal, bookie_id=bookie_id, registration=self.registration,
                                 decommission=self.decommission, ledgers_left=self.ledgers_left,
                                 decommission_message=self.message, in_use=self.in_use, **platform)


def decommission_phase(record: Decommission | None) -> tuple[DecommissionPhase, int | None, str]:
    """Phase, ledgers left (None when not known yet) and message of a `/decommission/<bookie>`
    record: requested and draining are in progress; a finished drain has 0 ledgers left."""
    if record is None:
        return DecommissionPhase.NONE, None, ""
    left = record.ledgers_remaining if record.ledgers_remaining >= 0 else None
    if record.state == FAILED:
        return DecommissionPhase.FAILED, left, record.message
    if record.state == DONE:
        return DecommissionPhase.DONE, 0, record.message
    return DecommissionPhase.IN_PROGRESS, left, record.message


async def scan_ledgers(store, watch: set[str]) -> tuple[int, set[str]]:
    """One pass over every ledger's metadata: the largest ensemble of any ledger that is not
    closed (0 when none), and which of the bookies in `watch` some fragment still names."""
    largest, used = 0, set()
    async for md in store.ledgers.list_metadata():
        if not md.is_closed:
            largest = max(largest, int(md.ensemble_size))
        if watch:
            for fragment in md.fragments:
                used.update(watch.intersection(fragment.bookies))
    return largest, used


def ledger_checks(spec: BookieClusterSpec, replicas: int,
                  removed_with_volumes: Iterable[str]) -> tuple[bool, list[str]]:
    """What `observe` must read every ledger for, as (`need_ensemble`, `check_in_use`): the largest
    open ensemble only while a scale-down is pending (`spec.replicas` below the `replicas` running),
    and whether removed bookies still holding volumes are named by a ledger only when
    pvcPolicy Delete would drop those volumes."""
    return spec.replicas < replicas, list(removed_with_volumes) if spec.pvc_policy == "Delete" else []


async def observe(store, bookie_ids: Iterable[str], *, need_ensemble: bool = False,
                  check_in_use: Iterable[str] = ()) -> tuple[MetadataObservation, dict[str, BookieMetadata]]:
    """Registry state and decommission progress of `bookie_ids`, plus cluster-wide counts.

    The bookies returned are `bookie_ids` and every bookie with a decommission record, so a
    platform also sees the drains of slots it no longer has. Every ledger's metadata is read
    (once) only when needed: for the largest open ensemble when `need_ensemble` (a scale-down is
    pending), and to tell whether the bookies in `check_in_use` (removed slots whose volumes could
    go) are still named by a ledger (see `ledger_checks`).
    """
    registered = await store.registry.all()
    under_replicated = await store.underreplication.count()
    ledger_defaults = await store.cluster.ledger_defaults()
    drains = await store.decommission.list()
    watch = set(check_in_use)
    ensemble, used = await scan_ledgers(store, watch) if (need_ensemble or watch) else (0, set())
    bookies: dict[str, BookieMetadata] = {}
    for bid in [*bookie_ids, *drains]:
        state, info = registered.get(bid, (None, None))
        reg = Registration(state) if state is not None else Registration.ABSENT  # all() holds writable|readonly
        phase, left, msg = decommission_phase(drains.get(bid))
        bookies[bid] = BookieMetadata(reg, phase, left, msg, getattr(info, "http", None) or None,
                                      (bid in used) if bid in watch else None)
    return MetadataObservation(under_replicated=under_replicated, max_open_ensemble=ensemble,
                               ledger_defaults=ledger_defaults), bookies


async def drained_away(store, bookie_id: str) -> bool:
    """True when etcd has no cookie for the bookie and no ledger names it: a drain finished and
    deleted its cookie, so any data still left on its disks is garbage (the bookie would refuse
    to start on it)."""
    from pybk.recovery import decommission

    if await store.cookies.get(bookie_id) is not None:
        return False
    return not await decommission.referencing_ledgers(store, bookie_id)


async def start_decommission(store, bookie_id: str, retry: bool = False) -> None:
    """Start draining a bookie with `pybk.recovery.decommission.start` (read-only, drain request,
    markers; a failed or finished earlier request is replaced). The elected auditor finishes it.
    A bookie etcd knows nothing about (never registered, no cookie, no ledger) has nothing to
    drain: its request is recorded as done at once so the scale-down can proceed."""
    from pybk.recovery import decommission

    if retry:
        await store.decommission.remove(bookie_id)
    try:
        await decommission.start(store, bookie_id)
    except decommission.UnknownBookieError as e:
        rec = await store.decommission.request(bookie_id, message="nothing to drain: " + str(e))
        await store.decommission.update(rec, state=DONE, ledgers_total=0, ledgers_remaining=0)


async def store_ledger_defaults(store, defaults: LedgerDefaults) -> None:
    """Store the spec's ledger defaults in the cluster record (`StoreLedgerDefaults`)."""
    await store.cluster.set_ledger_defaults(defaults)


async def clear_decommission(store, bookie_id: str) -> None:
    """Forget a finished drain record (the bookie is gone)."""
    await store.decommission.remove(bookie_id)


async def forget_bookie(store, bookie_id: str) -> None:
    """After a removed bookie's data was deleted: remove its cookie (the drain normally did)."""
    await store.cookies.delete(bookie_id)


async def cancel_decommission(store, bookie_id: str, http: str | None) -> None:
    """Drop a drain request and make the bookie writable again (scale-down undone)."""
    await store.decommission.remove(bookie_id)
    if http:
        await _admin(http, "PUT", "/api/v1/bookie/state/readonly", {"readOnly": False, "readonly": False})


async def _admin(http: str, method: str, path: str, body: Any) -> bool:
    import aiohttp

    from pybk.recovery.decommission import http_url
    from pybk.security.settings import ClientSecurity
    from pybk.security.web import admin_headers, admin_ssl

    url = http_url(http, path)  # the one place admin URLs (and their scheme) are built
    security = ClientSecurity.from_env()  # the operator's (or local supervisor's) CA and admin token
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
            async with s.request(method, url, json=body, ssl=admin_ssl(security),
                                 headers=admin_headers(security)) as resp:
                if resp.status >= 400:
                    log.warning("%s %s answered %d", method, url, resp.status)
                    return False
                return True
    except (aiohttp.ClientError, TimeoutError, OSError) as e:
        log.warning("%s %s failed: %s", method, url, e)
        return False
