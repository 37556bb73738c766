"""`pybk local up` in the foreground: start the cluster, watch its children, apply new
manifests when asked, and stop everything cleanly on a signal.

Children run in their own sessions, so Ctrl-C reaches only the supervisor, which then stops
bookies before etcd. `pybk local apply` writes DIR/cluster.yaml and sends SIGUSR1; the
supervisor reconciles towards it and reports in DIR/apply.json.
"""
from __future__ import annotations

import logging
import os
import signal
import time
from typing import Any, Callable

from .datadir import APPLY_JSON, MANIFEST, PID_FILE, manifest_generation, write_json
from .errors import ChangeRefused, LocalClusterError, ReconcileInterrupted
from .manifest import load_spec
from .platform import LocalCluster
from .process import interrupt_or_defer

log = logging.getLogger("pybk.local")


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

    def started(self) -> None:
        """From now on a stop signal stops a running cluster (exit 0) instead of aborting a start."""
        self.interrupt_startup = False

    def _on_reload(self, signum, frame) -> None:
        self.reload = True


def supervise(cluster: LocalCluster, on_ready: Callable[[dict[str, Any]], None] | None = None,
              poll: float = 0.25) -> int:
    """Run the cluster in the foreground until SIGINT/SIGTERM; stop everything cleanly.

    A child that exits on its own is reported (with its log) and started again after a back-off,
    as Kubernetes restarts a pod (LocalCluster.restart_crashed); local.json counts its restarts.
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
        doc = cluster.start(serving=sig.started)
        if on_ready is not None:
            on_ready(doc)
        while not sig.stop:
            if sig.reload:
                sig.reload = False
                _apply_manifest(cluster, sig)
            cluster.restart_crashed()
            time.sleep(poll)
        log.info("stopping the local cluster")
        return 0
    finally:
        cluster.stop()
        pid_file.unlink(missing_ok=True)


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
            write_json(cluster.data_dir / APPLY_JSON, {"generation": generation, "done": False, "error": None,
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
        write_json(cluster.data_dir / APPLY_JSON, {"generation": generation, "done": True, "error": error,
                                                   "conditions": cluster.conditions})
        if not sig.reload:
            return
