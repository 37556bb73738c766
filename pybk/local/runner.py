"""The local platform: a BookieCluster manifest realised as child processes on this machine.

`LocalCluster` runs one etcd, N bookies (`bookie-0`, `bookie-1`, ...) and the manifest's
autorecovery processes (`autorecovery-0`, ...) under a data dir:

    DIR/cluster.yaml          the desired manifest (what `up -f` / `apply -f` were given)
    DIR/ports.json            ports chosen once per process, reused on every start
    DIR/local.json            written once the cluster is ready (the issue's shape, plus "autorecovery")
    DIR/local.pid             the supervising `pybk local up` process
    DIR/apply.json            progress and outcome of the last `pybk local apply`
    DIR/etcd/, DIR/etcd.log, DIR/bookie-N/{journal,ledgers}, DIR/bookie-N.log, DIR/autorecovery-N.log

"Observe" (`observe()`, `observe_metadata()`) and "act" (`start_bookie`, `stop_bookie`, ...) are
kept apart; `reconcile()` loops observe -> `pybk.cluster.controller.plan` -> act, the same
controller the Kubernetes operator uses. Ports and directories of an ordinal never change, so a
restarted bookie keeps its cookie.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from pybk.cluster import actions as act
from pybk.cluster.controller import plan
from pybk.cluster.observed import (BookieObservation, DecommissionPhase, MetadataObservation, Observed,
                                   Registration)
from pybk.cluster.spec import BookieClusterSpec, SpecError, load_manifest
from pybk.recovery.process import AutoRecoveryProcess

from .bookie import BookieProcess
from .etcd import EtcdProcess
from .process import ChildProcess, free_port, interrupt_or_defer

log = logging.getLogger("pybk.local")

LOCAL_JSON = "local.json"
PID_FILE = "local.pid"
PORTS_JSON = "ports.json"
MANIFEST = "cluster.yaml"
APPLY_JSON = "apply.json"
DEFAULT_PREFIX = "pybk"


class LocalClusterError(RuntimeError):
    """The local cluster could not be started, changed or stopped; the message says why."""


class ChangeRefused(LocalClusterError):
    """A change that would be unsafe was refused before anything was done."""


class ReconcileInterrupted(LocalClusterError):
    """A newer manifest (or a stop) arrived before the change finished."""


# ---------------------------------------------------------------------------------------------
# The manifest.

def load_spec(path: str | Path) -> BookieClusterSpec:
    """Read and validate a BookieCluster manifest file; LocalClusterError says what is wrong."""
    try:
        return load_manifest(path)
    except SpecError as e:
        raise LocalClusterError(f"{path}: {e}") from None


def metadata_prefix(spec: BookieClusterSpec) -> str:
    """The etcd key prefix: the path of spec.metadataServiceUri if given (its hosts are ignored:
    the local platform runs its own etcd), else "pybk"."""
    uri = spec.metadata_service_uri
    if uri and "/" in uri[len("etcd://"):]:
        prefix = uri[len("etcd://"):].split("/", 1)[1].strip("/")
        if prefix:
            return prefix
    return DEFAULT_PREFIX


def _kebab(key: str) -> str:
    return "".join("-" + c.lower() if c.isupper() else c for c in key).replace("_", "-").lstrip("-")


def bookie_options(config: dict[str, str]) -> dict[str, str]:
    """spec.config as `pybk bookie` options: `journal-group-wait-ms: "2"` becomes
    `--journal-group-wait-ms 2` (camelCase and snake_case keys become kebab-case too)."""
    return {_kebab(k): v for k, v in sorted(config.items())}


def config_flags(config: dict[str, str]) -> list[str]:
    """spec.config as the bookie command-line flags it turns into."""
    flags: list[str] = []
    for key, value in bookie_options(config).items():
        flags += [f"--{key}", value]
    return flags


# ---------------------------------------------------------------------------------------------
# Files under the data dir.

def read_local_json(data_dir: str | Path) -> dict[str, Any]:
    """The local.json of a running (or crashed) local cluster; LocalClusterError if there is none."""
    path = Path(data_dir) / LOCAL_JSON
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise LocalClusterError(f"no local cluster is running in {data_dir} ({path} does not exist); "
                                f"start one with `pybk local up -f cluster.yaml --data-dir {data_dir}`") from None
    except (OSError, ValueError) as e:
        raise LocalClusterError(f"cannot read {path}: {e}") from None


def _write_json(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    os.replace(tmp, path)


def pid_alive(pid: int | None) -> bool:
    """True if a process with this pid exists (and is not a zombie)."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def process_mentions(pid: int, needle: str) -> bool:
    """True if the process's command line contains needle: guards against signalling a pid
    that was reused by an unrelated process since local.json was written."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return needle.encode() in f.read()
    except OSError:
        return False


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


# ---------------------------------------------------------------------------------------------
# The cluster.

@dataclass
class BookieSlot:
    """The stable identity of bookie ordinal N: id, ports and directories never change."""

    ordinal: int
    host: str
    grpc_port: int
    http_port: int
    base_dir: Path

    @property
    def bookie_id(self) -> str:
        return f"bookie-{self.ordinal}"

    @property
    def journal_dir(self) -> Path:
        return self.base_dir / self.bookie_id / "journal"

    @property
    def ledger_dirs(self) -> list[Path]:
        return [self.base_dir / self.bookie_id / "ledgers"]

    @property
    def log_path(self) -> Path:
        return self.base_dir / f"{self.bookie_id}.log"

    @property
    def grpc(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def http(self) -> str:
        return f"{self.host}:{self.http_port}"


class LocalCluster:
    """etcd + bookies of one data dir, owned by this process."""

    def __init__(self, spec: BookieClusterSpec, data_dir: str | Path, host: str = "127.0.0.1"):
        self.spec = spec
        self.data_dir = Path(data_dir).resolve()
        self.host = host
        self.etcd: EtcdProcess | None = None
        self.bookies: dict[int, BookieProcess] = {}
        self.slots: dict[int, BookieSlot] = {}
        self.config_hashes: dict[int, str] = {}
        self.recovery: dict[int, AutoRecoveryProcess] = {}
        self.applied_hash: str | None = None
        self.manifest_text: str | None = None
        self.conditions: list[dict[str, Any]] = []
        self._ports = self._load_ports()
        self._reported_dead: set[str] = set()

    # -- stable ports ------------------------------------------------------------------------
    def _load_ports(self) -> dict[str, Any]:
        try:
            return json.loads((self.data_dir / PORTS_JSON).read_text())
        except (OSError, ValueError):
            return {"etcd": {}, "bookies": {}, "autorecovery": {}}

    def _port(self, section: dict[str, Any], key: str) -> int:
        port = section.get(key)
        if port and _port_free(self.host, port):
            return port
        if port:
            log.warning("port %s recorded for %s is taken by another process; choosing a new one", port, key)
        taken = {p for d in [self._ports["etcd"], *self._ports["bookies"].values(),
                             *self._ports.setdefault("autorecovery", {}).values()] for p in d.values()}
        while True:
            candidate = free_port(self.host)
            if candidate not in taken:
                section[key] = candidate
                _write_json(self.data_dir / PORTS_JSON, self._ports)
                return candidate

    def slot(self, ordinal: int) -> BookieSlot:
        """Bookie ordinal N's id, ports and dirs for starting it: the recorded ports, or new free
        ones at first use (or if another process took a recorded port meanwhile)."""
        section = self._ports["bookies"].setdefault(f"bookie-{ordinal}", {})
        return BookieSlot(ordinal, self.host, self._port(section, "grpc"), self._port(section, "http"),
                          self.data_dir)

    @property
    def metadata_uri(self) -> str:
        assert self.etcd is not None, "etcd is not started"
        return self.etcd.metadata_uri(metadata_prefix(self.spec))

    # -- observe -----------------------------------------------------------------------------
    def observe(self, metadata: MetadataObservation | None = None,
                registry: dict[str, str] | None = None,
                decommissions: dict[str, Any] | None = None) -> Observed:
        """What runs, in the controller's terms: bookie slots 0..replicas-1 are our processes;
        ordinals above them appear while they still have a data dir or a decommission record.
        registry maps bookie id -> "writable"/"readonly"; decommissions maps bookie id -> record."""
        registry = registry or {}
        decommissions = decommissions or {}
        ordinals = set(self.bookies) | {o for o in self._data_dir_ordinals()}
        ordinals |= {int(b.split("-", 1)[1]) for b in decommissions if _is_local_bookie_id(b)}
        bookies = {}
        for o in sorted(ordinals):
            bid = f"bookie-{o}"
            proc = self.bookies.get(o)
            rec = decommissions.get(bid)
            phase, left, message = DecommissionPhase.NONE, None, ""
            if rec is not None:
                phase = {"requested": DecommissionPhase.IN_PROGRESS, "draining": DecommissionPhase.IN_PROGRESS,
                         "done": DecommissionPhase.DONE, "failed": DecommissionPhase.FAILED}[rec.state]
                left = rec.ledgers_remaining if rec.ledgers_remaining >= 0 else None
                message = rec.message
            alive = proc is not None and proc.alive()
            bookies[o] = BookieObservation(
                ordinal=o, bookie_id=bid, pod_exists=proc is not None, pod_ready=alive,
                registration=Registration(registry.get(bid, "absent")),
                config_hash=self.config_hashes.get(o), decommission=phase, ledgers_left=left,
                decommission_message=message, has_volumes=(self.data_dir / bid).exists())
        return Observed(resources_exist=bool(self.etcd and self.etcd.alive()), resources_hash=self.applied_hash,
                        replicas=len(self.bookies), bookies=bookies, metadata=metadata)

    def _data_dir_ordinals(self) -> list[int]:
        return [int(p.name.split("-", 1)[1]) for p in self.data_dir.glob("bookie-*")
                if p.is_dir() and _is_local_bookie_id(p.name)]

    async def observe_metadata(self, store: Any) -> tuple[MetadataObservation, dict[str, str], dict[str, Any]]:
        """From etcd: under-replication count, largest open ensemble, registry states, drain records."""
        from pybk.meta import LedgerState
        max_open = 0
        async for md in store.ledgers.list_metadata():
            if md.state in (LedgerState.OPEN, LedgerState.IN_RECOVERY):
                max_open = max(max_open, md.ensemble_size)
        registry = {bid: "writable" for bid in await store.registry.writable()}
        registry.update({bid: "readonly" for bid in await store.registry.readonly()})
        meta = MetadataObservation(under_replicated=await store.underreplication.count(),
                                   max_open_ensemble=max_open)
        return meta, registry, await store.decommission.list()

    # -- act ---------------------------------------------------------------------------------
    def start_etcd(self, timeout: float = 60.0) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        section = self._ports["etcd"]
        self.etcd = EtcdProcess(self.data_dir, client_port=self._port(section, "client"),
                                peer_port=self._port(section, "peer"), host=self.host)
        log.info("starting etcd on %s", self.etcd.client_url)
        self.etcd.start(timeout)

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
                             **bookie_options(self.spec.config))
        proc.name = slot.bookie_id
        proc.log_path = slot.log_path
        self.bookies[ordinal] = proc
        self.config_hashes[ordinal] = self.spec.restart_hash()
        proc.start(timeout, wait=False)
        self._reported_dead.discard(slot.bookie_id)
        if wait:
            self.wait_bookie(ordinal, timeout)
        return proc

    def wait_bookie(self, ordinal: int, timeout: float = 120.0) -> None:
        """Wait until bookie ordinal N answers /api/v1/bookie/is_ready (raises with its log if it dies)."""
        proc = self.bookies[ordinal]
        proc.wait_ready(proc.is_ready, timeout)

    def stop_bookie(self, ordinal: int, timeout: float = 30.0) -> None:
        """Stop bookie ordinal N cleanly (SIGTERM, then SIGKILL after timeout)."""
        proc = self.bookies.pop(ordinal, None)
        self.slots.pop(ordinal, None)
        self.config_hashes.pop(ordinal, None)
        if proc is not None:
            log.info("stopping bookie-%d", ordinal)
            proc.stop(timeout)

    def start_autorecovery(self, index: int, timeout: float = 120.0, wait: bool = True) -> AutoRecoveryProcess:
        """Start autorecovery-N (auditor candidate + replication worker); its settings come from the
        PYBK_LOST_BOOKIE_DELAY, PYBK_AUDIT_INTERVAL, ... environment variables."""
        current = self.recovery.get(index)
        if current is not None and current.alive():
            return current
        name = f"autorecovery-{index}"
        section = self._ports.setdefault("autorecovery", {}).setdefault(name, {})
        proc = AutoRecoveryProcess(self.data_dir / f"{name}.log", self.metadata_uri, name=name, host=self.host,
                                   http_port=self._port(section, "http"))
        log.info("starting %s (http %s:%s)", name, self.host, proc.http_port)
        self.recovery[index] = proc
        proc.start(timeout, wait=False)
        self._reported_dead.discard(name)
        if wait:
            proc.wait_ready(proc.is_ready, timeout)
        return proc

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
    def start(self, timeout: float = 120.0) -> dict[str, Any]:
        """Start etcd and spec.replicas bookies, wait until all serve, write local.json."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.start_etcd(timeout)
            for ordinal in range(self.spec.replicas):
                self.start_bookie(ordinal, timeout, wait=False)
            for ordinal in range(self.spec.replicas):
                self.wait_bookie(ordinal, timeout)
            self.ensure_resources(timeout)
        except BaseException:
            self.stop()
            raise
        return self.write_local_json()

    def reconcile(self, spec: BookieClusterSpec, timeout: float = 3600.0, poll: float = 0.5,
                  interrupted=lambda: False, on_progress=None) -> dict[str, Any]:
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

    async def _reconcile(self, timeout: float, poll: float, interrupted, on_progress) -> None:
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
                if degraded is not None and degraded.status and degraded.reason == "BelowLargestOpenEnsemble":
                    raise ChangeRefused(degraded.message)
                work = [a for a in steps if not isinstance(a, act.SetCondition)]
                progressing = conditions.get("Progressing")
                if not work and (progressing is None or not progressing.status):
                    return
                for a in work:
                    await self._act(store, a)
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
        from pybk.recovery import decommission
        bid = f"bookie-{ordinal}"
        base = self.data_dir / bid
        if not base.exists() or not any(p.is_file() for p in base.rglob("*")):
            return
        if await store.cookies.get(bid) is not None or await decommission.referencing_ledgers(store, bid):
            return
        log.info("%s was drained earlier (no cookie in etcd, no ledger references it): starting it with "
                 "empty directories", bid)
        await asyncio.to_thread(shutil.rmtree, base)

    async def _act(self, store: Any, a: Any) -> None:
        """Carry out one controller action on this machine."""
        from pybk.recovery import admin, decommission
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
                await admin.decommission_bookie(store, a.bookie_id, wait=False)
            except (admin.AdminError, decommission.DecommissionError) as e:
                raise ChangeRefused(f"cannot scale down: {e}") from None
        elif isinstance(a, act.WaitDecommission):
            left = "?" if a.ledgers_left is None else a.ledgers_left
            log.info("waiting for the drain of %s: %s ledgers left", a.bookie_id, left)
        elif isinstance(a, act.CancelDecommission):
            log.info("cancelling the decommission of %s", a.bookie_id)
            await store.decommission.remove(a.bookie_id)
            slot = self.slots.get(a.ordinal)
            if slot is not None:
                await _set_writable(decommission.http_url(slot.http, "/api/v1/bookie/state/readonly"))
        elif isinstance(a, act.ClearDecommission):
            await store.decommission.remove(a.bookie_id)
        elif isinstance(a, act.DeletePVCs):
            log.info("deleting the data of removed bookie-%d (pvcPolicy Delete)", a.ordinal)
            await asyncio.to_thread(shutil.rmtree, self.data_dir / f"bookie-{a.ordinal}", True)
        elif isinstance(a, act.RestartBookie):
            log.info("restarting %s with the new config", a.bookie_id)
            await asyncio.to_thread(self.stop_bookie, a.ordinal)
            await asyncio.to_thread(self.start_bookie, a.ordinal)

    def info(self) -> dict[str, Any]:
        """The local.json document for what runs now."""
        assert self.etcd is not None
        bookies = []
        for ordinal in sorted(self.bookies):
            proc = self.bookies[ordinal]
            slot = self.slots[ordinal]
            bookies.append({"id": slot.bookie_id, "pid": proc.pid, "grpc": slot.grpc, "http": slot.http,
                            "journal_dir": str(slot.journal_dir),
                            "ledger_dirs": [str(d) for d in slot.ledger_dirs]})
        recovery = [{"id": p.recovery_name, "pid": p.pid, "http": f"{p.host}:{p.http_port}"}
                    for _, p in sorted(self.recovery.items())]
        return {"metadata_service_uri": self.metadata_uri,
                "etcd": {"pid": self.etcd.pid, "client_url": self.etcd.client_url},
                "bookies": bookies, "autorecovery": recovery}

    def write_local_json(self) -> dict[str, Any]:
        doc = self.info()
        _write_json(self.data_dir / LOCAL_JSON, doc)
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

    def dead_children(self) -> list[ChildProcess]:
        """Children that exited without being asked to, each reported once."""
        found = []
        for p in [self.etcd, *self.bookies.values(), *self.recovery.values()]:
            if p is not None and p.proc is not None and not p.alive() and p.name not in self._reported_dead:
                self._reported_dead.add(p.name)
                found.append(p)
        return found


def _is_local_bookie_id(name: str) -> bool:
    head, _, tail = name.partition("-")
    return head == "bookie" and tail.isdigit()


async def _set_writable(url: str) -> None:
    import aiohttp
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
            async with s.put(url, json={"readOnly": False}) as resp:
                if resp.status >= 400:
                    log.warning("%s answered %s", url, resp.status)
    except aiohttp.ClientError as e:
        log.warning("could not make the bookie writable again at %s: %s", url, e)


# ---------------------------------------------------------------------------------------------
# Foreground supervision and `down` from another process.

class _Signals:
    """SIGINT/SIGTERM/SIGHUP (Ctrl-C, `down`, a closed terminal) request a stop, aborting a
    start-up at once; SIGUSR1 (`pybk local apply`) requests a re-read of DIR/cluster.yaml."""

    def __init__(self) -> None:
        self.stop = False
        self.reload = False
        self.interrupt_startup = True

    def install(self) -> None:
        signal.signal(signal.SIGINT, self._on_stop)
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGHUP, self._on_stop)
        signal.signal(signal.SIGUSR1, self._on_reload)

    def _on_stop(self, signum, frame) -> None:
        self.stop = True
        if self.interrupt_startup:
            self.interrupt_startup = False  # once: a second signal must not break the clean-up
            interrupt_or_defer()

    def _on_reload(self, signum, frame) -> None:
        self.reload = True


def supervise(cluster: LocalCluster, on_ready=None, poll: float = 0.25) -> int:
    """Run the cluster in the foreground until SIGINT/SIGTERM; stop everything cleanly.

    Children run in their own sessions, so Ctrl-C reaches only this process, which then stops
    bookies before etcd. A child that exits on its own is reported (with its log) once and left
    down: a local cluster is for experiments, including killing bookies on purpose.
    """
    sig = _Signals()
    sig.install()
    pid_file = cluster.data_dir / PID_FILE
    cluster.data_dir.mkdir(parents=True, exist_ok=True)
    pid_file.write_text(f"{os.getpid()}\n")
    try:
        try:
            cluster.manifest_text = (cluster.data_dir / MANIFEST).read_text()
        except OSError:
            pass
        doc = cluster.start()
        sig.interrupt_startup = False
        if on_ready is not None:
            on_ready(doc)
        while not sig.stop:
            if sig.reload:
                sig.reload = False
                _apply_manifest(cluster, sig)
            for dead in cluster.dead_children():
                log.error("%s (pid %s) exited with code %s; last lines of %s:\n%s", dead.name, dead.pid,
                          dead.proc.returncode, dead.log_path, dead.log_tail(10))
            time.sleep(poll)
        log.info("stopping the local cluster")
        return 0
    finally:
        cluster.stop()
        pid_file.unlink(missing_ok=True)


def manifest_generation(data_dir: Path) -> int:
    """Identifies one version of DIR/cluster.yaml (its mtime in ns), echoed in DIR/apply.json."""
    try:
        return (Path(data_dir) / MANIFEST).stat().st_mtime_ns
    except OSError:
        return 0


def _apply_manifest(cluster: LocalCluster, sig: _Signals) -> None:
    """Reconcile towards DIR/cluster.yaml, reporting progress and the outcome in DIR/apply.json.
    A newer manifest applied meanwhile takes over at once (the controller undoes what the older
    one started, e.g. cancels a drain). A refused change puts the previous manifest back."""
    path = cluster.data_dir / MANIFEST
    while not sig.stop:
        sig.reload = False
        generation = manifest_generation(cluster.data_dir)
        previous = cluster.spec

        def progress(conditions: list[dict[str, Any]], generation: int = generation) -> None:
            _write_json(cluster.data_dir / APPLY_JSON, {"generation": generation, "done": False, "error": None,
                                                        "conditions": conditions})

        error = None
        try:
            text = path.read_text()
            cluster.reconcile(load_spec(path), interrupted=lambda: sig.stop or sig.reload, on_progress=progress)
            cluster.manifest_text = text
            log.info("applied %s: %d bookies", path, cluster.spec.replicas)
        except ReconcileInterrupted as e:
            error = str(e)
            log.info("%s", e)
        except ChangeRefused as e:
            error = str(e)
            log.error("apply refused: %s", e)
            cluster.spec = previous
            if cluster.manifest_text is not None:
                path.write_text(cluster.manifest_text)
        except LocalClusterError as e:
            error = str(e)
            log.error("apply failed: %s", e)
        except Exception as e:  # whatever went wrong, the running cluster stays up
            error = f"{type(e).__name__}: {e}"
            log.exception("apply failed")
        _write_json(cluster.data_dir / APPLY_JSON, {"generation": generation, "done": True, "error": error,
                                                    "conditions": cluster.conditions})
        if not sig.reload:
            return


def running_supervisor(data_dir: str | Path) -> int | None:
    """The pid of the `pybk local up` supervising data_dir, if it is alive."""
    try:
        pid = int((Path(data_dir) / PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None
    if pid_alive(pid) and process_mentions(pid, "local"):
        return pid
    return None


def _wait_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while True:
        left = [p for p in pids if pid_alive(p)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)


def down(data_dir: str | Path, timeout: float = 60.0) -> list[str]:
    """Stop the local cluster running in data_dir, from any process; returns what was stopped.

    First asks the supervisor to stop (it stops its children in order); then stops any recorded
    child still alive by its process group, SIGTERM then SIGKILL. Only pids whose command line
    names data_dir are signalled.
    """
    data_dir = Path(data_dir).resolve()
    stopped: list[str] = []
    supervisor = running_supervisor(data_dir)
    try:
        doc = read_local_json(data_dir)
    except LocalClusterError:
        doc = None
    if supervisor is None and doc is None:
        raise LocalClusterError(f"no local cluster is running in {data_dir}")
    children: list[tuple[str, int]] = []
    if doc is not None:
        # (name, pid, a string its command line must hold: guards against reused pids)
        uri = doc.get("metadata_service_uri") or str(data_dir)
        recorded = [(r.get("id", "autorecovery"), r.get("pid"), uri) for r in doc.get("autorecovery", [])]
        recorded += [(b.get("id", "bookie"), b.get("pid"), str(data_dir)) for b in doc.get("bookies", [])]
        recorded.append(("etcd", (doc.get("etcd") or {}).get("pid"), str(data_dir)))
        children = [(name, pid) for name, pid, needle in recorded
                    if pid and pid_alive(pid) and process_mentions(pid, needle)]
    if supervisor is not None:
        os.kill(supervisor, signal.SIGTERM)
        if _wait_gone([supervisor], timeout):
            os.kill(supervisor, signal.SIGKILL)
            stopped.append(f"supervisor (pid {supervisor}, killed after {timeout:.0f}s)")
        else:
            stopped.append(f"supervisor (pid {supervisor})")
    for name, pid in children:
        if pid_alive(pid):
            _killpg(pid, signal.SIGTERM)
    left = _wait_gone([pid for _, pid in children], timeout)
    for pid in left:
        _killpg(pid, signal.SIGKILL)
    _wait_gone(left, 10)
    stopped += [f"{name} (pid {pid})" for name, pid in children]
    (data_dir / LOCAL_JSON).unlink(missing_ok=True)
    (data_dir / PID_FILE).unlink(missing_ok=True)
    return stopped


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        os.kill(pid, sig)


@contextlib.contextmanager
def detached(manifest: str | Path, data_dir: str | Path, timeout: float = 180.0,
             env: dict[str, str] | None = None) -> Iterator[dict[str, Any]]:
    """`pybk local up --detach` for tests and scripts: yields local.json, always runs `down` after.
    env (e.g. {"PYBK_LOST_BOOKIE_DELAY": "2"}) is added to the environment of every process."""
    cmd = [sys.executable, "-m", "pybk.cli", "local"]
    data_dir = str(Path(data_dir).resolve())
    proc = subprocess.run([*cmd, "up", "-f", str(manifest), "--data-dir", data_dir, "--detach",
                           "--timeout", str(timeout)], capture_output=True, text=True, timeout=timeout + 60,
                          env={**os.environ, **env} if env else None)
    try:
        if proc.returncode != 0:
            raise LocalClusterError(f"pybk local up failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
        yield read_local_json(data_dir)
    finally:
        if running_supervisor(data_dir) is not None or (Path(data_dir) / LOCAL_JSON).exists():
            subprocess.run([*cmd, "down", "--data-dir", data_dir], capture_output=True, timeout=120)
