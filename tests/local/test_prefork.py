"""A child forked from the preloaded interpreter is the program a spawn would have started: same
argv, environment, directory, output and exit status, its own process group, signalled and
waited for as a spawned child is."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

from pybk.local.autorecovery import AutoRecoveryProcess
from pybk.local.bookie import BookieProcess
from pybk.local.control import pid_alive
from pybk.local.prefork import Preforker, PreforkedChild
from pybk.local.process import free_port


def test_a_forked_command_prints_and_exits_as_a_spawned_one(tmp_path, child_processes):
    """`bookie --help` and a bookie refused its environment: the forked child's output and exit
    status are the spawned one's, and it reads the environment it was given, not the preforker's."""
    preforker = Preforker()
    try:
        for argv, env in [([sys.executable, "-m", "pybk.cli", "bookie", "--help"], {}),
                          ([sys.executable, "-m", "pybk.cli", "bookie", "--journal-dir", str(tmp_path / "j")],
                           {"PYBK_JOURNAL_GROUP_WAIT": "not-a-number"})]:
            full_env = {**os.environ, **env}
            spawned = subprocess.run(argv, env=full_env, cwd=tmp_path, capture_output=True, timeout=60)
            log = tmp_path / f"forked-{len(env)}.log"
            forked = preforker.start(argv, log, full_env)
            assert isinstance(forked, PreforkedChild)
            assert forked.wait(60) == spawned.returncode
            assert log.read_bytes() == spawned.stdout + spawned.stderr
        assert spawned.returncode != 0 and b"PYBK_JOURNAL_GROUP_WAIT" in spawned.stderr
    finally:
        preforker.close()


def test_a_forked_bookie_is_its_own_process_group_and_is_reaped_with_its_status(tmp_path, child_processes):
    """The `child_processes` fixture forks `python -m pybk...` children: a bookie started so leads
    its own session, stops on SIGTERM with status 0, and a kill -9 is reported as -9."""
    bookie = BookieProcess(tmp_path / "b", metadata_uri=None).start()
    assert isinstance(bookie.proc, PreforkedChild)
    assert os.getpgid(bookie.pid) == bookie.pid and os.getsid(bookie.pid) == bookie.pid
    assert bookie.stop() == 0
    again = BookieProcess(tmp_path / "b", metadata_uri=None, port=bookie.port, http_port=bookie.http_port,
                          bookie_id=bookie.bookie_id).start()
    again.signal(signal.SIGKILL)
    assert again.proc.wait(30) == -signal.SIGKILL
    assert not again.alive()


def test_a_stop_sent_right_after_a_start_reaches_the_child(tmp_path, child_processes):
    """A stop signals the child's process group; the start must not return before the forked
    child has one, or the SIGTERM is lost and the stop ends in a kill -9 after its timeout (a
    local cluster stopped just after it started its autorecovery waited 30 s so)."""
    for i in range(20):
        recovery = AutoRecoveryProcess(tmp_path / f"recovery-{i}.log", "etcd://127.0.0.1:1/pybk")
        recovery.start(wait=False)
        assert isinstance(recovery.proc, PreforkedChild)
        code = recovery.stop(timeout=10)   # (with no etcd at port 1 it would exit 1 by itself, later)
        assert code in (0, -signal.SIGTERM), f"start {i}: the SIGTERM did not reach the child (exit {code})"


def test_children_still_running_when_the_preforker_closes_are_killed_with_it(tmp_path, child_processes):
    """A test that fails to stop a process it started (a race in its teardown, say) must not leave
    it running after the test run: closing the preforker kills every child it started that still
    runs, and one that already ended is left as it was."""
    preforker = Preforker()
    try:
        done = preforker.start([sys.executable, "-m", "pybk.cli", "bookie", "--help"], tmp_path / "done.log", None)
        assert done.wait(60) == 0
        left = preforker.start([sys.executable, "-m", "pybk.cli", "bookie", "--journal-dir", str(tmp_path / "j"),
                                "--ledger-dir", str(tmp_path / "l"), "--port", str(free_port()),
                                "--http-port", str(free_port())],
                               tmp_path / "left.log", None)
        assert left.poll() is None
    finally:
        preforker.close()
    assert not pid_alive(left.pid), f"pid {left.pid} outlived its preforker"

