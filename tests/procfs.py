"""What /proc says of a process, for tests that bound a real process's memory, and the priority
of a process's threads for tests that bound its event loop's stalls in wall time (imported by name)."""
from __future__ import annotations

import asyncio
import contextlib
import fcntl
import gc
import os
import tempfile
from pathlib import Path


def rss(pid: int) -> int:
    """Resident set size of a process in bytes (VmRSS of /proc/<pid>/status)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


FAVOURED_LOCK = Path(tempfile.gettempdir()) / "pybk-tests-favoured.lock"


@contextlib.asynccontextmanager
async def favoured(*pids: int):
    """Run every thread of this process and of `pids` ahead of the rest of the machine (real-time
    round robin, priority 1) while a test times them in wall time: the figures are then of what
    the test's own work costs them, and other tests' processes sharing these cores, however
    many, are no part of it. One test at a time on the machine is favoured (a lock file, waited
    for off the event loop): two would share the cores in round-robin slices of 100 ms. A thread
    or process they start meanwhile starts at normal priority (SCHED_RESET_ON_FORK), so nothing
    outlives the test favoured; the kernel's real-time throttling still leaves the rest of the
    machine 5% of each core. Needs root (else the priorities stay as they are). The objects this
    process holds already (the test runner's, hundreds of tests' worth) are frozen out of the
    garbage collector meanwhile, so a full pass over them is not timed either (it took 100 ms in
    a worker late in a run, where the same test alone shows no stall)."""
    with open(FAVOURED_LOCK, "a") as lock:
        await asyncio.to_thread(fcntl.flock, lock, fcntl.LOCK_EX)   # released when the file closes
        threads = [int(t) for pid in (os.getpid(), *pids) for t in os.listdir(f"/proc/{pid}/task")]
        before = {tid: os.sched_getscheduler(tid) for tid in threads}  # Linux: a policy per thread
        try:
            for tid in before:
                os.sched_setscheduler(tid, os.SCHED_RR | os.SCHED_RESET_ON_FORK, os.sched_param(1))
        except PermissionError:
            pass
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            gc.unfreeze()
            for tid, policy in before.items():
                with contextlib.suppress(OSError):
                    os.sched_setscheduler(tid, policy, os.sched_param(0))
