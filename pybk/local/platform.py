"""The local platform: a BookieCluster manifest realised as child processes on this machine.

`LocalCluster` runs one etcd, N bookies (`bookie-0`, `bookie-1`, ...) and the manifest's
autorecovery processes (`autorecovery-0`, ...) under a data dir (see `datadir` for its files).

"Observe" (`observe_metadata()` through the shared `pybk.cluster.metadata`, then `observe()`) and
"act" (`act()`: one `pybk.cluster.actions` step as processes and etcd requests) are kept apart;
`reconcile()` loops observe -> `pybk.cluster.controller.plan` -> act, the same controller and
the same etcd side the Kubernetes operator uses. Ports and directories of an ordinal never
change (`slots`), so a restarted bookie keeps its cookie.

A child that exits without being asked to (a crash, kill -9) is started again, as a StatefulSet
restarts its pod: after RESTART_DELAY seconds, doubling with each crash in a row up to
RESTART_MAX_DELAY (Kubernetes' CrashLoopBackOff); a process that ran RESTART_STABLE seconds
starts the count afresh. `restart_crashed()` does it (the supervisor calls it as it polls), and
local.json shows each process's restarts.
"""
from __future__ import annotations

import asyncio
import logging
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from pybk.cluster import actions as act
from pybk.cluster import metadata as meta_side
from pybk.cluster.controller import BELOW_ENSEMBLE, plan
from pybk.cluster.observed import MetadataObservation, Observed
from pybk.cluster.spec import BookieClusterSpec
from pybk.local.autorecovery import AutoRecoveryProcess
from pybk.security.roles import Role

from .bookie import BookieProcess
from .datadir import LOCAL_JSON, write_json
from .errors import ChangeRefused, LocalClusterError, ReconcileInterrupted
from .etcd import EtcdProcess
from .manifest import bookie_options, metadata_prefix
from .process import ChildProcess
from .secure import EtcdUser, Identity, LocalSecurity
from .slots import BOOKIE_PREFIX, BookieSlot, Ports, bookie_id, ordinal_of

log = logging.getLogger("pybk.local")

Conditions = list[dict[str, Any]]
RESTART_DELAY = 1.0        # seconds before a crashed child is started again, the first time
RESTART_MAX_DELAY = 60.0   # ... doubling with each crash in a row up to this
RESTART_STABLE = 60.0      # a child that ran this long before it crashed starts the doubling afresh


@dataclass
class Restarts:
    """One child's restarts: how many so far, the crashes in a row (each within RESTART_STABLE of
    its start), when it last started, and when it is due to start again while it is down."""

    count: int = 0
    streak: int = 0
    started: float = 0.0
    due: float | None = None
    last_exit: int | None = None

    def crashed(self, now: float, code: int | None) -> float:
        """Note a crash found at `now`; returns the seconds until the child starts again."""
        self.streak = 1 if now - self.started >= RESTART_STABLE else self.streak + 1
        self.last_exit = code
        delay = min(RESTART_DELAY * 2 ** (self.streak - 1), RESTART_MAX_DELAY)
        self.due = now + delay
        return delay


class LocalCluster:
    """etcd + bookies + autorecovery of one data dir, owned by this process."""

    def __init__(self, spec: BookieClusterSpec, data_dir: str | Path, host: str = "127.0.0.1",
                 security: LocalSecurity | None = None):
        self.spec = spec
        self.security = security
        self.data_dir = Path(data_dir).resolve()
        self.host = host
        self.etcd: EtcdProcess | None = None
        self.bookies: dict[int, BookieProcess] = {}
        self.slots: dict[int, BookieSlot] = {}
        self.config_hashes: dict[int, str] = {}
        self.recovery: dict[int, AutoRecoveryProcess] = {}
        self.applied_hash: str | None = None
        self.manifest_text: str | None = None
        self.conditions: Conditions = []
        self.ports = Ports(self.data_dir, host)
        self.restarts: dict[str, Restarts] = {}  # by process name: etcd, bookie-N, autorecovery-N

    def slot(self, ordinal: int) -> BookieSlot:
        """Bookie ordinal N's id, ports and dirs for starting it: the recorded ports, or new free
        ones at first use (or if another process took a recorded port meanwhile)."""
        return self.ports.bookie_slot(ordinal, self.data_dir)

    @property
    def metadata_uri(self) -> str:
        """The URI every process of the cluster (and local.json's clients) uses: with --secure it
        carries the etcd options (CA, read-write user, password file)."""
        assert self.etcd is not None, "etcd is not started"
        login = self.security.etcd_login() if self.security else {}
        return self.etcd.metadata_uri(metadata_prefix(self.spec), **login)

    # -- observe -----------------------------------------------------------------------------
    async def observe_metadata(self, store: Any) -> tuple[MetadataObservation, dict[str, meta_side.BookieMetadata]]:
        """What etcd says about the bookies of every slot, running or left with a data dir, and
        of every bookie with a decommission record (`pybk.cluster.metadata.observe`)."""
        running = len(self.bookies)
        ordinals = sorted(set(self.bookies) | set(self._data_dir_ordinals()))
        removed = [bookie_id(o) for o in ordinals if o >= running and o not in self.bookies]
        need_ensemble, check_in_use = meta_side.ledger_checks(self.spec, running, removed)
        return await meta_side.observe(store, [bookie_id(o) for o in ordinals], need_ensemble=need_ensemble,
                                       check_in_use=check_in_use)

    def observe(self, metadata: MetadataObservation | None = None,
                by_id: Mapping[str, meta_side.BookieMetadata] | None = None) -> Observed:
        """What runs, in the controller's terms: bookie slots 0..replicas-1 are our processes;
        ordinals above them appear while they still have a data dir or a decommission record.
        `metadata` and `by_id` are what `observe_metadata` read (None: etcd could not be read)."""
        by_id = by_id or {}
        ordinals = set(self.bookies) | set(self._data_dir_ordinals())
        ordinals |= {o for bid in by_id if (o := ordinal_of(bid)) is not None}
        bookies = {}
        for o in sorted(ordinals):
            bid = bookie_id(o)
            proc = self.bookies.get(o)
            m = by_id.get(bid, meta_side.BookieMetadata())
            bookies[o] = m.observation(o, bid, pod_exists=proc is not None,
                                       pod_ready=proc is not None and proc.alive(),
                                       config_hash=self.config_hashes.get(o), has_volumes=(self.data_dir / bid).exists())
        return Observed(resources_exist=bool(self.etcd and self.etcd.alive()), resources_hash=self.applied_hash,
                        replicas=len(self.bookies), bookies=bookies, metadata=metadata)

    def _data_dir_ordinals(self) -> list[int]:
        return [o for p in self.data_dir.glob(BOOKIE_PREFIX + "*")
                if p.is_dir() and (o := ordinal_of(p.name)) is not None]

    # -- processes ---------------------------------------------------------------------------
    def start_etcd(self, timeout: float = 60.0) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.etcd = EtcdProcess(self.data_dir, client_port=self.ports.port("etcd", "client"),
                                peer_port=self.ports.port("etcd", "peer"), host=self.host,
                                tls=self.security.etcd_tls() if self.security else None)
        log.info("starting etcd on %s", self.etcd.client_url)
        self._starting("etcd", None)
        self.etcd.start(timeout)
        if self.security is not None:
            asyncio.run(self._enable_etcd_auth())

    async def _enable_etcd_auth(self) -> None:
        """Turn etcd auth on for the cluster's prefix (idempotent: again at every start): root,
        `pybk` reading and writing the prefix, `pybk-reader` only reading it."""
        from pybk.meta.etcd_auth import EtcdAccess, enable_auth
        assert self.security is not None and self.etcd is not None
        passwords = self.security.etcd_users()
        await enable_auth(self.etcd.metadata_uri(metadata_prefix(self.spec)), passwords[EtcdUser.ROOT],
                          {EtcdUser.READWRITE.value: (passwords[EtcdUser.READWRITE], EtcdAccess.READWRITE),
                           EtcdUser.READ.value: (passwords[EtcdUser.READ], EtcdAccess.READ)})

    def start_bookie(self, ordinal: int, timeout: float = 120.0, wait: bool = True) -> BookieProcess:
        """Start bookie ordinal N (if not running); with wait, return once it is ready."""
        current = self.bookies.get(ordinal)
        if current is not None and current.alive():
            return current
        slot = self.slots[ordinal] = self.slot(ordinal)
        for d in [slot.journal_dir, *slot.ledger_dirs]:
            d.mkdir(parents=True, exist_ok=True)
        log.info("starting %s (grpc %s, http %s)", slot.bookie_id, slot.grpc, slot.http)
        proc = BookieProcess(self.data_dir / slot.bookie_id, metadata_uri=self.metadata_uri, host=slot.host,
                             port=slot.grpc_port, http_port=slot.http_port, bookie_id=slot.bookie_id,
                             journal_dir=slot.journal_dir, ledger_dirs=slot.ledger_dirs,
                             **bookie_options(self.spec.config), **self._server_options(Identity.BOOKIE))
        proc.name = slot.bookie_id
        proc.log_path = slot.log_path
        self._starting(slot.bookie_id, current)
        self.bookies[ordinal] = proc
        self.config_hashes[ordinal] = self.spec.restart_hash()
        proc.start(timeout, wait=False)
        if wait:
            self.wait_bookie(ordinal, timeout)
        return proc

    def wait_bookie(self, ordinal: int, timeout: float = 120.0) -> None:
        """Wait until bookie ordinal N answers /api/v1/bookie/is_ready (raises with its log if it
        dies). A bookie whose port another process took before it bound it is started again on
        new ports: its id is its ordinal's, so its data and registration stay its own."""
        name = bookie_id(ordinal)

        def elsewhere() -> BookieProcess:
            log.warning("%s lost its port to another process before it bound it; starting it on new ports", name)
            self.ports.port("bookies", name, "grpc", renew=True)
            self.ports.port("bookies", name, "http", renew=True)
            return self.start_bookie(ordinal, timeout, wait=False)

        self.bookies[ordinal].wait_started(timeout, elsewhere=elsewhere)

    def stop_bookie(self, ordinal: int, timeout: float = 30.0) -> None:
        """Stop bookie ordinal N cleanly (SIGTERM, then SIGKILL after timeout)."""
        proc = self.bookies.pop(ordinal, None)
        self.slots.pop(ordinal, None)
        self.config_hashes.pop(ordinal, None)
        if proc is not None:
            log.info("stopping %s", bookie_id(ordinal))
            proc.stop(timeout)

    def start_autorecovery(self, index: int, timeout: float = 120.0, wait: bool = True) -> AutoRecoveryProcess:
        """Start autorecovery-N (auditor candidate + replication worker); its settings come from the
        PYBK_LOST_BOOKIE_DELAY, PYBK_AUDIT_INTERVAL, ... environment variables."""
        current = self.recovery.get(index)
        if current is not None and current.alive():
            return current
        name = f"autorecovery-{index}"
        proc = AutoRecoveryProcess(self.data_dir / f"{name}.log", self.metadata_uri, name=name, host=self.host,
                                   http_port=self.ports.port("autorecovery", name, "http"),
                                   **self._server_options(Identity.AUTORECOVERY))
        log.info("starting %s (http %s:%s)", name, self.host, proc.http_port)
        self._starting(name, current)
        self.recovery[index] = proc
        proc.start(timeout, wait=False)
        if wait:
            proc.wait_ready(proc.is_ready, timeout)
        return proc

    def _starting(self, name: str, previous: ChildProcess | None) -> None:
        """Note a child's start; a start in place of one that exited on its own is a restart (a
        child stopped on purpose is no longer in the cluster's table)."""
        r = self.restarts.setdefault(name, Restarts())
        if previous is not None and previous.proc is not None and not previous.alive():
            r.count += 1
        r.started, r.due = time.monotonic(), None

    def restart_crashed(self) -> list[str]:
        """Start again, each after its back-off, every child that exited without being asked to;
        returns the names started now. A crash is logged once, with the child's last log lines and
        when it starts again."""
        now = time.monotonic()
        started = []
        children: list[tuple[str, ChildProcess | None, Callable[[], Any]]] = [("etcd", self.etcd, self._restart_etcd)]
        children += [(p.name, p, lambda o=o: self.start_bookie(o, wait=False)) for o, p in sorted(self.bookies.items())]
        children += [(p.recovery_name, p, lambda i=i: self.start_autorecovery(i, wait=False))
                     for i, p in sorted(self.recovery.items())]
        for name, proc, start in children:
            if proc is None or proc.proc is None or proc.alive():
                continue
            r = self.restarts.setdefault(name, Restarts())
            if r.due is None:
                delay = r.crashed(now, proc.proc.returncode)
                log.error("%s (pid %s) exited with code %s; starting it again in %.0fs (restart %d); last lines of "
                          "%s:\n%s", name, proc.pid, proc.proc.returncode, delay, r.count + 1, proc.log_path,
                          proc.log_tail(10))
            elif now >= r.due:
                log.info("starting %s again (restart %d)", name, r.count + 1)
                start()
                started.append(name)
        if started:
            self.write_local_json()
        return started

    def _restart_etcd(self) -> None:
        assert self.etcd is not None
        self._starting("etcd", self.etcd)
        self.etcd.start(wait=False)

    def _server_options(self, who: Identity) -> dict[str, str]:
        """The security flags of a bookie or autorecovery process (none when not --secure)."""
        return self.security.server_options(who) if self.security else {}

    def stop_autorecovery(self, index: int, timeout: float = 30.0) -> None:
        proc = self.recovery.pop(index, None)
        if proc is not None:
            log.info("stopping autorecovery-%d", index)
            proc.stop(timeout)

    def ensure_resources(self, timeout: float = 120.0) -> None:
        """Everything but the bookie count: the autorecovery processes."""
        want = self.spec.autorecovery.replicas
        for index in sorted(self.recovery):
            if index >= want:
                self.stop_autorecovery(index)
        for index in range(want):
            self.start_autorecovery(index, timeout, wait=False)
        for index in range(want):
            proc = self.recovery[index]
            proc.wait_ready(proc.is_ready, timeout)
        self.applied_hash = self.spec.resources_hash()

    # -- whole cluster -----------------------------------------------------------------------
    def start(self, timeout: float = 120.0, serving: Callable[[], None] = lambda: None) -> dict[str, Any]:
        """Start etcd and spec.replicas bookies, wait until all serve, write local.json. serving()
        runs just before local.json announces the cluster: from there on it is up, not starting."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.start_etcd(timeout)
            for ordinal in range(self.spec.replicas):
                self.start_bookie(ordinal, timeout, wait=False)
            for ordinal in range(self.spec.replicas):
                self.wait_bookie(ordinal, timeout)
            self.ensure_resources(timeout)
            # one pass of the controller, as `pybk local apply` runs: e.g. the ledger defaults
            asyncio.run(self._reconcile(timeout, 0.5, lambda: False, None, announce=False))
        except BaseException:
            self.stop()
            raise
        serving()
        return self.write_local_json()

    def reconcile(self, spec: BookieClusterSpec, timeout: float = 3600.0, poll: float = 0.5,
                  interrupted: Callable[[], bool] = lambda: False,
                  on_progress: Callable[[Conditions], None] | None = None) -> dict[str, Any]:
        """Drive the running cluster to spec through the shared controller: observe, plan, act,
        until nothing is progressing. Scale-down drains (decommissions) the highest bookie first
        and stops it only once no ledger references it; going below the largest ensemble of an
        open ledger is refused."""
        problems = spec.problems()
        if problems:
            raise ChangeRefused("; ".join(problems))
        if metadata_prefix(spec) != metadata_prefix(self.spec):
            raise ChangeRefused(f"the metadata prefix cannot change on a running cluster "
                                f"({metadata_prefix(self.spec)!r} -> {metadata_prefix(spec)!r}): "
                                f"`pybk local down` and start it again instead")
        self.spec = spec
        asyncio.run(self._reconcile(timeout, poll, interrupted, on_progress))
        return self.write_local_json()

    async def _reconcile(self, timeout: float, poll: float, interrupted: Callable[[], bool],
                         on_progress: Callable[[Conditions], None] | None, announce: bool = True) -> None:
        """Act on the controller's plan until it has nothing left to do; with announce, local.json
        shows each step's outcome (not while starting: local.json announces a cluster that serves,
        and a Ctrl-C before then aborts the start)."""
        from pybk.meta import MetadataStore
        deadline = time.monotonic() + timeout
        store = await MetadataStore.connect(self.metadata_uri)
        try:
            for o, proc in sorted(self.bookies.items()):
                if not proc.alive():  # the spec wants it running: a crashed slot is started again
                    log.info("%s is not running: starting it again", proc.name)
                    await self._forget_if_drained(store, o)
                    await asyncio.to_thread(self.start_bookie, o)
            while True:
                observed = self.observe(*await self.observe_metadata(store))
                steps = plan(self.spec, observed)
                conditions = {a.type: a for a in steps if isinstance(a, act.SetCondition)}
                self.conditions = [{"type": c.type, "status": c.status, "reason": c.reason, "message": c.message}
                                   for c in conditions.values()]
                if on_progress is not None:
                    on_progress(self.conditions)
                degraded = conditions.get("Degraded")
                if degraded is not None and degraded.status and degraded.reason == BELOW_ENSEMBLE:
                    raise ChangeRefused(degraded.message)
                work = [a for a in steps if not isinstance(a, act.SetCondition)]
                progressing = conditions.get("Progressing")
                if not work and (progressing is None or not progressing.status):
                    return
                for a in work:
                    await self.act(store, a)
                if announce:
                    self.write_local_json()
                if interrupted():
                    raise ReconcileInterrupted("a newer manifest or a stop arrived before this change finished")
                if time.monotonic() > deadline:
                    msg = progressing.message if progressing else "no progress"
                    raise LocalClusterError(f"the change did not finish within {timeout:.0f}s: {msg}")
                if all(isinstance(a, act.WaitDecommission) for a in work) or not work:
                    await asyncio.sleep(poll)
        finally:
            await store.close()

    async def _forget_if_drained(self, store: Any, ordinal: int) -> None:
        """An ordinal drained earlier left dirs whose cookie etcd no longer has, so its bookie would
        refuse to start: when no ledger references it, its data is garbage; start it afresh."""
        bid = bookie_id(ordinal)
        base = self.data_dir / bid
        if not base.exists() or not any(p.is_file() for p in base.rglob("*")):
            return
        if not await meta_side.drained_away(store, bid):
            return
        log.info("%s was drained earlier (no cookie in etcd, no ledger references it): starting it with "
                 "empty directories", bid)
        await asyncio.to_thread(shutil.rmtree, base)

    def _http(self, ordinal: int) -> str | None:
        slot = self.slots.get(ordinal)
        return slot.http if slot is not None else None

    async def act(self, store: Any, a: act.Action) -> None:
        """Carry out one controller action on this machine; the etcd side goes through
        `pybk.cluster.metadata`, as on Kubernetes."""
        from pybk.recovery.decommission import DecommissionError
        if isinstance(a, act.EnsureResources):
            await asyncio.to_thread(self.ensure_resources)
        elif isinstance(a, act.ScaleStatefulSet):
            current = len(self.bookies)
            if a.replicas > current:
                log.info("scaling up from %d to %d bookies", current, a.replicas)
                for o in range(current, a.replicas):
                    await self._forget_if_drained(store, o)
                    await asyncio.to_thread(self.start_bookie, o)
            for o in sorted(self.bookies, reverse=True):
                if o >= a.replicas:
                    await asyncio.to_thread(self.stop_bookie, o)
        elif isinstance(a, act.StartDecommission):
            log.info("decommissioning %s%s: draining its ledgers to the other bookies", a.bookie_id,
                     " (retry)" if a.retry else "")
            try:
                await meta_side.start_decommission(store, a.bookie_id, retry=a.retry)
            except DecommissionError as e:
                raise ChangeRefused(f"cannot scale down: {e}") from None
        elif isinstance(a, act.WaitDecommission):
            left = "?" if a.ledgers_left is None else a.ledgers_left
            log.info("waiting for the drain of %s: %s ledgers left", a.bookie_id, left)
        elif isinstance(a, act.CancelDecommission):
            log.info("cancelling the decommission of %s", a.bookie_id)
            await meta_side.cancel_decommission(store, a.bookie_id, self._http(a.ordinal))
        elif isinstance(a, act.ClearDecommission):
            await meta_side.clear_decommission(store, a.bookie_id)
        elif isinstance(a, act.DeletePVCs):
            log.info("deleting the data of removed %s (pvcPolicy Delete)", bookie_id(a.ordinal))
            await asyncio.to_thread(shutil.rmtree, self.data_dir / bookie_id(a.ordinal), True)
            await meta_side.forget_bookie(store, bookie_id(a.ordinal))
        elif isinstance(a, act.RestartBookie):
            log.info("restarting %s with the new config", a.bookie_id)
            await asyncio.to_thread(self.stop_bookie, a.ordinal)
            await asyncio.to_thread(self.start_bookie, a.ordinal)
        elif isinstance(a, act.StoreLedgerDefaults):
            d = a.defaults
            log.info("storing the ledger defaults E/Qw/Qa %d/%d/%d in etcd", d.ensemble, d.write_quorum, d.ack_quorum)
            await meta_side.store_ledger_defaults(store, d)

    def info(self) -> dict[str, Any]:
        """The local.json document for what runs now."""
        assert self.etcd is not None
        bookies = []
        for ordinal in sorted(self.bookies):
            proc = self.bookies[ordinal]
            slot = self.slots[ordinal]
            bookies.append({"id": slot.bookie_id, "pid": proc.pid, "grpc": slot.grpc, "http": slot.http,
                            "journal_dir": str(slot.journal_dir),
                            "ledger_dirs": [str(d) for d in slot.ledger_dirs], **self._restart_info(slot.bookie_id)})
        recovery = [{"id": p.recovery_name, "pid": p.pid, "http": f"{p.host}:{p.http_port}",
                     **self._restart_info(p.recovery_name)} for _, p in sorted(self.recovery.items())]
        doc: dict[str, Any] = {"metadata_service_uri": self.metadata_uri,
                               "etcd": {"pid": self.etcd.pid, "client_url": self.etcd.client_url,
                                        **self._restart_info("etcd")},
                               "bookies": bookies, "autorecovery": recovery}
        if self.security is not None:
            doc.update(self.client_settings())
        return doc

    def _restart_info(self, name: str) -> dict[str, Any]:
        """local.json's restart fields of a process: how often it was restarted after exiting on
        its own, and with which exit code it last did (null: never)."""
        r = self.restarts.get(name, Restarts())
        return {"restarts": r.count, "last_exit_code": r.last_exit}

    def client_settings(self) -> dict[str, Any]:
        """local.json's security part (file names only): `security`, what clients present by
        default (the admin identity); `credentials`, the same for each role; and the read-only
        metadata URI (etcd user with read access to the prefix)."""
        assert self.security is not None and self.etcd is not None
        read_only = self.etcd.metadata_uri(metadata_prefix(self.spec), **self.security.etcd_login(EtcdUser.READ))
        return {"security": self.security.client(Role.ADMIN).as_mapping(),
                "credentials": {str(role): self.security.client(role).as_mapping() for role in Role},
                "read_only_metadata_service_uri": read_only}

    def write_local_json(self) -> dict[str, Any]:
        doc = self.info()
        write_json(self.data_dir / LOCAL_JSON, doc)
        return doc

    def stop(self, timeout: float = 30.0) -> None:
        """Stop autorecovery, then every bookie (all at once), then etcd; remove local.json."""
        for index in sorted(self.recovery):
            self.stop_autorecovery(index, timeout)
        procs = list(self.bookies.values())
        for p in procs:
            p.signal(signal.SIGTERM)
        for p in procs:
            p.stop(timeout)
        self.bookies.clear()
        self.slots.clear()
        self.config_hashes.clear()
        if self.etcd is not None:
            self.etcd.stop(timeout)
        (self.data_dir / LOCAL_JSON).unlink(missing_ok=True)
