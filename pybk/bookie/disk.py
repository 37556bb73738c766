"""A bookie's disk state: how full its dirs are against the water marks, and every reason it is
read-only (the disk, a failed journal, a request through the admin API).

`DiskState` decides when the bookie turns read-only and when it is writable again; it is told of
bytes written (so its own writes trip the high-water mark at once, not a sampling interval later),
of writes that found the disk full and of a journal that failed, and says each change through
`on_change`.
"""
from __future__ import annotations

import asyncio
import enum
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from pybk.config import option_field

from .metrics import Metrics

log = logging.getLogger("pybk.bookie")

READ_ONLY_FILE = "READONLY"  # in the journal dir while read-only by request


class ReadOnlyReason(enum.Enum):
    """Why a bookie refuses adds (it may have several reasons at once)."""
    DISK = "disk"            # above the high-water mark, or a write found the disk full
    JOURNAL = "journal"      # a journal write failed: until restarted
    REQUESTED = "requested"  # the admin API (a decommission drains a bookie this way)


@dataclass(frozen=True)
class DiskOptions:
    """When the bookie turns read-only for want of room, and when it is writable again."""

    high_water_mark: float = option_field("high_water_mark")
    low_water_mark: float = option_field("low_water_mark")
    capacity: int = option_field("disk_capacity")  # 0: the filesystem's size; else a byte budget for our dirs
    check_interval: float = option_field("disk_check_interval")


def disk_fullness(path: Path) -> tuple[float, int]:
    """(used fraction, total bytes) of the disk holding `path`, as the water marks see it: free
    space counted as an unprivileged writer sees it, so root's reserved blocks count as used."""
    u = shutil.disk_usage(path)
    total = u.used + u.free
    return (u.used / total if total else 0.0), total


class DiskState:
    """The read-only state of one bookie's dirs (the journal dir first)."""

    def __init__(self, dirs: list[Path], options: DiskOptions, metrics: Metrics):
        self.dirs = dirs
        self.opts = options
        self.metrics = metrics
        self.forced = False          # read-only by request (a file in the journal dir keeps it)
        self.disk = False            # above the high-water mark, or a write found the disk full
        self.journal_failed = False  # a journal write failed: read-only until restarted
        self.usage = 0.0
        self._total = 0  # bytes of the disk (or budget) usage is a fraction of
        self._written_since_check = 0
        self.on_change: Callable[[bool], None] | None = None
        metrics.water_marks(options.high_water_mark, options.low_water_mark)
        metrics.explain_read_only(ReadOnlyReason, lambda: self.reasons)

    @property
    def read_only(self) -> bool:
        return self.forced or self.disk or self.journal_failed

    @property
    def reasons(self) -> list[ReadOnlyReason]:
        """Every reason the bookie is read-only now (empty: writable)."""
        held = {ReadOnlyReason.DISK: self.disk, ReadOnlyReason.JOURNAL: self.journal_failed,
                ReadOnlyReason.REQUESTED: self.forced}
        return [reason for reason, on in held.items() if on]

    def open(self) -> None:
        """Take up a request made before the last stop and measure the disks."""
        self.forced = (self.dirs[0] / READ_ONLY_FILE).exists()
        self.measured(*self.measure())
        self.metrics.read_only.set(int(self.read_only))

    def measure(self) -> tuple[float, int]:
        """(used fraction, total bytes): of the byte budget (disk_capacity) by our dirs, else of
        the fullest disk (free space counted as an unprivileged writer sees it)."""
        if self.opts.capacity > 0:
            used = 0
            for d in self.dirs:
                for root, _, files in os.walk(d):
                    for f in files:
                        try:
                            used += os.stat(os.path.join(root, f)).st_size
                        except OSError:
                            pass
            return used / self.opts.capacity, self.opts.capacity
        return max(disk_fullness(d) for d in self.dirs)

    def space(self, ledger_dir: Path) -> tuple[int, int]:
        """(free, total) bytes for the Info call."""
        if self.opts.capacity > 0:
            used = int(self.usage * self.opts.capacity)
            return max(self.opts.capacity - used, 0), self.opts.capacity
        u = shutil.disk_usage(ledger_dir)
        return u.free, u.total

    def measured(self, usage: float, total: int) -> None:
        self.usage, self._total, self._written_since_check = usage, total, 0
        self.metrics.disk_measured(usage, total)
        self._at(usage)

    def note_written(self, nbytes: int) -> None:
        """Count bytes written since the last disk check, so the bookie turns read-only as soon as
        its own writes cross the high-water mark, not a sampling interval later."""
        self._written_since_check += nbytes
        if not self.disk and self._total:
            estimate = self.usage + self._written_since_check / self._total
            if estimate >= self.opts.high_water_mark:
                self._at(estimate)

    def journal_failure(self, exc: BaseException, recoverable: bool) -> None:
        """The journal's write failed: for want of room (recoverable), or for good."""
        if recoverable:
            self.no_room("journal", exc)
            return
        log.error("journal write failed (%s): read-only until restarted; acknowledged adds are safe", exc)
        self._set(lambda: setattr(self, "journal_failed", True))

    def no_room(self, what: str, exc: BaseException) -> None:
        """A write found the disk full: nothing was half written (the journal and the entry log cut
        a failed write back); turn read-only until usage is below the low-water mark again."""
        if not self.disk:
            log.warning("%s: the disk is full (%s); read-only until disk usage is below the low-water "
                        "mark %.2f. Acknowledged entries are safe.", what, exc, self.opts.low_water_mark)
        self._set(lambda: setattr(self, "disk", True))

    def request(self, value: bool) -> None:
        """Force read-only by request (admin API), or lift that request. The request survives
        restarts (a file in the journal dir), so a draining bookie stays read-only."""
        marker = self.dirs[0] / READ_ONLY_FILE
        if value:
            marker.write_text("read-only by request through the admin API\n")
        else:
            marker.unlink(missing_ok=True)
        self._set(lambda: setattr(self, "forced", value))

    async def watch(self, on_measured: Callable[[], None]) -> None:
        """Measure every check_interval seconds (in a worker thread), then call on_measured."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.opts.check_interval)
            try:
                self.measured(*await loop.run_in_executor(None, self.measure))
                on_measured()
            except Exception:  # noqa: BLE001
                log.exception("disk check failed")

    def _at(self, usage: float) -> None:
        """Apply the water marks to a usage measured or estimated."""
        self.metrics.disk_usage.set(usage)
        high, low = self.opts.high_water_mark, self.opts.low_water_mark
        if not self.disk and usage >= high:
            log.warning("disk usage %.4f >= high-water mark %.4f: turning read-only", usage, high)
            self._set(lambda: setattr(self, "disk", True))
        elif self.disk and usage < low:
            log.warning("disk usage %.4f < low-water mark %.4f: writable again", usage, low)
            self._set(lambda: setattr(self, "disk", False))

    def _set(self, change: Callable[[], None]) -> None:
        """Make a change and, if it turned the bookie read-only or writable, say so."""
        before = self.read_only
        change()
        if before != self.read_only:
            self.metrics.read_only.set(int(self.read_only))
            if self.on_change:
                self.on_change(self.read_only)
