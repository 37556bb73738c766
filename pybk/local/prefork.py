"""Starting `python -m pybk...` children from an interpreter that has imported pybk already.

Most of a bookie's start is Python importing pybk, grpc, aiohttp and numpy: about half a second
of CPU, paid again by each of the hundreds of bookies a test run starts. A Preforker is one
Python process (`python -m pybk.local.prefork`) that imports them once and forks a child for
each start. The child then runs the same module with the same argv, environment, working
directory and log as a spawned one would, in a session of its own, so its process group is
signalled as a spawned child's is. The preforker tells the child's pid only once the child has
that group: a stop sent right after the start reaches it. The preforker is its parent: it reaps
it and tells its exit status when asked (`PreforkedChild` answers as a Popen does). Children
still running when the asking process closes the preforker are killed with it: a test run's
processes end with the run, even those a test failed to stop.
"""
from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

# The pybk commands whose module (pybk.cli.COMMANDS) the preforker imports at their first start,
# so every later start forks with it in memory. Only modules that read no environment when
# imported (kopf does: an operator forked with it loaded finds no credentials, so not "operator").
WARM = frozenset({"bookie", "autorecovery"})
_HEADER = struct.Struct("!I")


def _send(sock: socket.socket, message: dict) -> None:
    data = json.dumps(message).encode()
    sock.sendall(_HEADER.pack(len(data)) + data)


def _receive(sock: socket.socket) -> dict | None:
    """The next message, or None when the other end closed."""
    header = _read_exactly(sock, _HEADER.size)
    if header is None:
        return None
    body = _read_exactly(sock, _HEADER.unpack(header)[0])
    return None if body is None else json.loads(body)


def _read_exactly(sock: socket.socket, size: int) -> bytes | None:
    chunks, got = [], 0
    while got < size:
        chunk = sock.recv(size - got)
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def module_of(argv: list[str]) -> str | None:
    """The pybk module `argv` runs (`python -m pybk...`, started with this interpreter), else None."""
    if len(argv) >= 3 and argv[0] == sys.executable and argv[1] == "-m" and argv[2].split(".")[0] == "pybk":
        return argv[2]
    return None


class PreforkedChild:
    """A child the preforker started: polled and waited for as a Popen."""

    def __init__(self, preforker: "Preforker", pid: int):
        self._preforker = preforker
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._preforker.ask({"poll": self.pid})["returncode"]
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            time.sleep(0.01)
        return self.returncode


class Preforker:
    """One preloaded interpreter that forks the `python -m pybk...` children of this process."""

    def __init__(self) -> None:
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def ask(self, request: dict) -> dict:
        """The preforker's answer to one request (started on the first)."""
        with self._lock:
            if self._sock is None:
                ours, theirs = socket.socketpair()
                self._proc = subprocess.Popen([sys.executable, "-m", "pybk.local.prefork", str(theirs.fileno())],
                                              pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
                theirs.close()
                self._sock = ours
            _send(self._sock, request)
            answer = _receive(self._sock)
        if answer is None:
            raise RuntimeError(f"the preforker (pid {self._proc.pid}) exited with code {self._proc.wait()}")
        return answer

    def start(self, argv: list[str], log_path: Path, env: dict[str, str] | None) -> PreforkedChild | None:
        """Start `argv` forked from the preloaded interpreter, its output appended to log_path;
        None when argv is not a `python -m pybk...` command (spawn that)."""
        if module_of(argv) is None:
            return None
        answer = self.ask({"argv": argv, "log": str(log_path), "cwd": os.getcwd(),
                           "env": dict(os.environ if env is None else env)})
        return PreforkedChild(self, answer["pid"])

    def close(self) -> None:
        """Stop the preforker and every child it started that still runs."""
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None
            if self._proc is not None:
                self._proc.wait()
                self._proc = None


def _become(request: dict) -> None:
    """In the forked child: take the request's log, environment and directory, run its module
    as `python -m` would, and exit with its status."""
    code = 1
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        limit = os.sysconf("SC_OPEN_MAX")
        os.closerange(3, limit if limit < 1 << 20 else 1 << 16)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        if os.environ.get("PYTHONUNBUFFERED"):
            sys.stdout.reconfigure(write_through=True)
        import runpy
        argv = request["argv"]
        sys.argv = [argv[2], *argv[3:]]
        sys.modules.pop(argv[2], None)   # run as __main__ alone, as `python -m` runs it
        try:
            runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if exc.code is not None and not isinstance(exc.code, int):
                print(exc.code, file=sys.stderr)
        except BaseException:
            import traceback
            traceback.print_exc()
            code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _warm(argv: list[str]) -> None:
    """Import the module of the pybk.cli command in argv if it is one of WARM (once: imported
    modules stay)."""
    from pybk.cli import COMMANDS, chosen_command
    command = chosen_command(argv[3:]) if argv[2] == "pybk.cli" else None
    if command in WARM:
        importlib.import_module(COMMANDS[command][0])


def _serve(sock: socket.socket) -> None:
    """Fork a child per start request, and tell a child's exit status when asked, until the
    asking process closes the socket."""
    ended: dict[int, int] = {}
    started: set[int] = set()
    while (request := _receive(sock)) is not None:
        if "poll" in request:
            _reap(ended)
            _send(sock, {"returncode": ended.get(request["poll"])})
            continue
        _warm(request["argv"])
        settled, in_session = os.pipe()
        child = os.fork()
        if child == 0:
            sock.close()
            os.close(settled)
            os.setsid()          # its own session and process group, as a spawned child's
            os.close(in_session)
            _become(request)
        os.close(in_session)
        os.read(settled, 1)      # EOF once the child has its own group: only then can it be signalled by it
        os.close(settled)
        started.add(child)
        _send(sock, {"pid": child})
    _reap(ended)
    for pid in started - ended.keys():
        for kill in (os.kill, os.killpg):  # it (it may not have called setsid yet), then what it started
            with contextlib.suppress(ProcessLookupError):
                kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def _reap(ended: dict[int, int]) -> None:
    """Note the exit status of every child that has ended since the last call."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if not pid:
            return
        ended[pid] = os.waitstatus_to_exitcode(status)


def main() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)     # the asker's Ctrl-C is the asker's to handle
    importlib.import_module("pybk.cli")
    _serve(sock)


if __name__ == "__main__":
    main()
