"""Child processes we own: started in their own session, stopped by process group.

Used by the local runner and by the tests. Never kill by name: only the process groups
we created are signalled.
"""
from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Callable


_spawning = 0      # children being spawned right now (Popen in progress)
_preforker = None  # a Preforker that starts `python -m pybk...` children (prefork_pybk), else spawn
_deferred = False  # an interrupt arrived meanwhile


def interrupt_or_defer() -> None:
    """For signal handlers: raise KeyboardInterrupt now, or, while a child is being spawned,
    as soon as its pid is kept. Raised inside Popen after the fork, the interrupt would
    orphan the child: Popen does not kill it and we would never learn its pid."""
    global _deferred
    if _spawning:
        _deferred = True
    else:
        raise KeyboardInterrupt


_handed_out: set[int] = set()


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' source ports (Linux default 32768-60999)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on host now and is likely to stay free until a child binds it.

    A port the kernel picks with bind(0) comes from the ephemeral range, which every outgoing
    connection also draws its source port from, so between this call and the child's bind a
    client socket can take it. We pick outside that range instead, and never hand out the same
    port twice in one process."""
    low, high = _ephemeral_range()
    ranges = [r for r in ((10000, low - 1), (high + 1, 65535)) if r[1] - r[0] > 1000] or [(1024, 65535)]
    rng = random.Random()
    for _ in range(1000):
        first, last = rng.choice(ranges)
        port = rng.randint(first, last)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free TCP port found on {host}")


def prefork_pybk(enabled: bool) -> None:
    """Start this process's `python -m pybk...` children forked from one interpreter that has
    imported pybk already (pybk.local.prefork), or, with enabled False, spawn each again."""
    global _preforker
    if enabled and _preforker is None:
        from pybk.local.prefork import Preforker
        _preforker = Preforker()
    elif not enabled and _preforker is not None:
        _preforker.close()
        _preforker = None


class ChildProcess:
    """One child process with its log file, in its own process group."""

    def __init__(self, name: str, argv: list[str], log_path: Path, env: dict[str, str] | None = None):
        self.name = name
        self.argv = argv
        self.log_path = Path(log_path)
        self.env = env
        self.proc: subprocess.Popen | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> "ChildProcess":
        global _spawning, _deferred
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        _spawning += 1
        try:
            self.proc = ((_preforker and _preforker.start(self.argv, self.log_path, self.env)) or
                         subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, env=self.env, start_new_session=True))
        finally:
            _spawning -= 1
            log.close()
        if _deferred and not _spawning:
            _deferred = False
            raise KeyboardInterrupt
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, check: Callable[[], bool], timeout: float = 30.0) -> None:
        """Poll check() until it is true; raise with the log's tail if the process dies or times out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"{self.name} exited with code {self.proc.returncode if self.proc else None}"
                                   f" before it was ready; log {self.log_path}:\n{self.log_tail()}")
            try:
                if check():
                    return
            except Exception:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"{self.name} was not ready within {timeout:.0f}s; log {self.log_path}:\n"
                           f"{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def signal(self, sig: int) -> None:
        if self.alive():
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        """kill -9 the whole process group, as a crash would."""
        self.signal(signal.SIGKILL)
        if self.proc:
            self.proc.wait()

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after timeout; returns the exit code."""
        if self.proc is None:
            return None
        if self.alive():
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode


class AdminHttp:
    """The admin HTTP API of a pybk child process (a bookie, autorecovery): where it answers and
    what it is called with, its own tls_* (verifying with its tls_ca) and token_file. The class
    that mixes it in has `host`, `http_port` and `options` (the process's options by name)."""

    host: str
    http_port: int
    options: dict

    @property
    def tls(self) -> bool:
        """Whether its admin HTTP serves TLS (it was given tls_cert)."""
        return bool(self.options.get("tls_cert"))

    @property
    def http_url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.http_port}"

    @property
    def http_security(self):
        """What its admin HTTP is called with (a ClientSecurity)."""
        from pybk.security.settings import ClientSecurity
        return ClientSecurity.from_mapping(self.options)

    def http_call(self, path: str, method: str = "GET", body: dict | None = None,
                  timeout: float = 10.0) -> tuple[int, bytes]:
        """(status, body) of an admin API call; an error status is answered, not raised."""
        import urllib.error

        from pybk.security.web import admin_urlopen
        try:
            with admin_urlopen(self.http_url + path, self.http_security, method, body, timeout) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

