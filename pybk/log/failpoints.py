"""Failpoints between the etcd and bookie steps of a log's open, roll, truncate and delete, so
fault tests can stop a writer exactly there (as a crash would). Off unless a test arms one:

    failpoints.arm("open.after_epoch", failpoints.crash)
    ...
    failpoints.disarm()

The names are in POINTS; `hit(name)` costs one dict lookup on an empty dict when nothing is armed."""
from __future__ import annotations

import asyncio
from typing import Awaitable, Callable

POINTS = (
    "open.after_epoch",      # the epoch is bumped; open segments not fenced yet
    "open.after_recover",    # open segments fenced and recovered; not sealed yet
    "open.after_create",     # the new segment's ledger exists; not committed yet
    "roll.after_close",      # the old segment's ledger is closed; segments not changed yet
    "roll.after_commit",     # old segment sealed, new one committed; next ledger not made yet
    "truncate.after_mark",   # segments marked TRUNCATED; ledgers not deleted yet
    "truncate.after_ledgers",  # ledgers deleted; segment keys not deleted yet
    "delete.after_name",     # the name is free, the log DELETING; ledgers not deleted yet
)


class Crash(Exception):
    """What `crash` raises: the step stops as if its process died there."""


Action = Callable[[str], Awaitable[None] | None]
_armed: dict[str, Action] = {}


def arm(name: str, action: Action) -> None:
    """Run `action(name)` each time the step reaches `name` (a plain or async callable)."""
    if name not in POINTS:
        raise ValueError(f"unknown failpoint {name!r}; known: {', '.join(POINTS)}")
    _armed[name] = action


def disarm(name: str | None = None) -> None:
    """Disarm one failpoint, or all."""
    if name is None:
        _armed.clear()
    else:
        _armed.pop(name, None)


def crash(name: str) -> None:
    raise Crash(f"failpoint {name}")


async def hit(name: str) -> None:
    """Called by the log code at each point; does nothing unless armed."""
    if _armed:
        action = _armed.get(name)
        if action is not None:
            result = action(name)
            if asyncio.iscoroutine(result):
                await result
