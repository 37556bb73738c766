"""A local cluster controlled from another process: is one running (DIR/local.pid, local.json),
`pybk local down`, and `detached` for tests and scripts.

Processes are found through the pids the data dir records, never by name; a pid is signalled
only while its command line still names the data dir (or the cluster's metadata URI), which
guards against pids reused by unrelated processes.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

from .datadir import LOCAL_JSON, PID_FILE, read_local_json
from .errors import LocalClusterError


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


def running_supervisor(data_dir: str | Path) -> int | None:
    """The pid of the `pybk local up` supervising data_dir, if it is alive."""
    try:
        pid = int((Path(data_dir) / PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None
    if pid_alive(pid) and process_mentions(pid, "local"):
        return pid
    return None


def live_children(doc: dict[str, Any], data_dir: Path) -> list[tuple[str, int]]:
    """(name, pid) of the processes a local.json records that still run: autorecovery, bookies,
    etcd. Bookies and etcd name the data dir on their command line, autorecovery the metadata URI."""
    uri = doc.get("metadata_service_uri") or str(data_dir)
    recorded = [(r.get("id", "autorecovery"), r.get("pid"), uri) for r in doc.get("autorecovery", [])]
    recorded += [(b.get("id", "bookie"), b.get("pid"), str(data_dir)) for b in doc.get("bookies", [])]
    recorded.append(("etcd", (doc.get("etcd") or {}).get("pid"), str(data_dir)))
    return [(name, pid) for name, pid, needle in recorded if pid and pid_alive(pid) and process_mentions(pid, needle)]


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
    child still alive by its process group, SIGTERM then SIGKILL.
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
    children = live_children(doc, data_dir) if doc is not None else []
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
             env: dict[str, str] | None = None, secure: bool = False) -> Iterator[dict[str, Any]]:
    """`pybk local up --detach [--secure]` for tests and scripts: yields local.json, always runs
    `down` after. env (e.g. {"PYBK_LOST_BOOKIE_DELAY": "2"}) is added to the environment of every
    process."""
    cmd = [sys.executable, "-m", "pybk.cli", "local"]
    data_dir = str(Path(data_dir).resolve())
    proc = subprocess.run([*cmd, "up", "-f", str(manifest), "--data-dir", data_dir, "--detach",
                           "--timeout", str(timeout), *(["--secure"] if secure else [])],
                          capture_output=True, text=True, timeout=timeout + 60,
                          env={**os.environ, **env} if env else None)
    try:
        if proc.returncode != 0:
            raise LocalClusterError(f"pybk local up failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
        yield read_local_json(data_dir)
    finally:
        if running_supervisor(data_dir) is not None or (Path(data_dir) / LOCAL_JSON).exists():
            subprocess.run([*cmd, "down", "--data-dir", data_dir], capture_output=True, timeout=120)
