"""Polling with a deadline, shared by the tests (imported by name: tests/ has no packages)."""
from __future__ import annotations

import asyncio
import time


async def eventually(check, timeout: float = 60.0, interval: float = 0.1, what: str = "condition"):
    """Call `check` (plain or async) until it returns a truthy value, which is returned; fail naming
    `what` and the last value after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if asyncio.iscoroutine(last):
            last = await last
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")
