"""What /proc says of a process, for tests that bound a real process's memory (imported by name)."""
from __future__ import annotations


def rss(pid: int) -> int:
    """Resident set size of a process in bytes (VmRSS of /proc/<pid>/status)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")
