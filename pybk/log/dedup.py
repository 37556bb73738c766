"""Idempotent producers: the last sequence number stored per producer, so a record re-sent after a
timeout or a failover is stored once. Pure state (no I/O): the writer feeds it what it appends,
a takeover rebuilds it from the segment's snapshot plus the recovered tail.

Per producer it keeps the last sequence and timestamp, and the (sequence range -> offsets) of its
last `window` entries, so a duplicate of a recent record is answered with that record's offset.
At most `max_producers` are kept (the least recently active dropped first), and a producer whose
last record is older than `idle_ms` is forgotten."""
from __future__ import annotations

import struct
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

_SNAP = struct.Struct(">QqqQ")   # producer id, last sequence, offset of that record, its timestamp


@dataclass(slots=True)
class Run:
    """Records first_seq..last_seq of one producer, stored from first_offset on; `ack` is what
    says they are acknowledged (the writer's entry future; None once known stored)."""

    first_seq: int
    last_seq: int
    first_offset: int
    ack: Any = None


@dataclass(slots=True)
class Producer:
    last_seq: int
    last_ts: int
    runs: deque = field(default_factory=deque)


@dataclass(frozen=True, slots=True)
class Duplicate:
    """A sequence already stored (or pending): its offset, and the ack to wait for (None: stored)."""

    offset: int
    ack: Any


@dataclass(frozen=True, slots=True)
class Forgotten:
    """A sequence stored before the producer's remembered window: its offset is unknown."""

    last_seq: int


class Dedup:
    """Last sequences per producer, bounded and expiring (see the module docstring)."""

    def __init__(self, max_producers: int = 1000, idle_ms: int = 6 * 3600 * 1000, window: int = 64):
        self.max_producers = max_producers
        self.idle_ms = idle_ms
        self.window = window
        self.producers: OrderedDict[int, Producer] = OrderedDict()

    def check(self, producer_id: int, sequence: int) -> Duplicate | Forgotten | None:
        """None if `sequence` is new for the producer (above its last), else what was stored."""
        p = self.producers.get(producer_id)
        if p is None or sequence > p.last_seq:
            return None
        for run in reversed(p.runs):
            if run.first_seq <= sequence <= run.last_seq:
                return Duplicate(run.first_offset + sequence - run.first_seq, run.ack)
            if run.last_seq < sequence:
                break
        return Forgotten(p.last_seq)

    def next_sequence(self, producer_id: int) -> int:
        p = self.producers.get(producer_id)
        return 0 if p is None else p.last_seq + 1

    def record(self, producer_id: int, first_seq: int, count: int, first_offset: int, timestamp: int,
               ack: Any = None) -> None:
        """Records first_seq.. (count of them) of a producer went to offsets first_offset.. ."""
        p = self.producers.get(producer_id)
        last = first_seq + count - 1
        if p is None:
            p = self.producers[producer_id] = Producer(last, timestamp)
            self._bound()
        else:
            self.producers.move_to_end(producer_id)
            p.last_seq = max(p.last_seq, last)
            p.last_ts = max(p.last_ts, timestamp)
        runs = p.runs
        if runs and runs[-1].ack is ack and runs[-1].last_seq + 1 == first_seq and \
                runs[-1].first_offset + runs[-1].last_seq - runs[-1].first_seq + 1 == first_offset:
            runs[-1].last_seq = last
        else:
            runs.append(Run(first_seq, last, first_offset, ack))
            if len(runs) > self.window:
                runs.popleft()

    def _bound(self) -> None:
        while len(self.producers) > self.max_producers:
            self.producers.popitem(last=False)

    def expire(self, now_ms: int) -> int:
        """Forget producers idle longer than idle_ms; returns how many went."""
        old = [pid for pid, p in self.producers.items() if now_ms - p.last_ts > self.idle_ms]
        for pid in old:
            del self.producers[pid]
        return len(old)

    def snapshot(self) -> bytes:
        """Each producer's last sequence, its offset and timestamp, least recently active first."""
        out = bytearray()
        for pid, p in self.producers.items():
            r = p.runs[-1] if p.runs else None
            off = r.first_offset + r.last_seq - r.first_seq if r is not None and r.last_seq == p.last_seq else -1
            out += _SNAP.pack(pid, p.last_seq, off, p.last_ts)
        return bytes(out)

    @classmethod
    def from_snapshot(cls, data: bytes, max_producers: int = 1000, idle_ms: int = 6 * 3600 * 1000,
                      window: int = 64) -> "Dedup":
        d = cls(max_producers, idle_ms, window)
        usable = len(data) - len(data) % _SNAP.size
        for pid, last, off, ts in _SNAP.iter_unpack(data[:usable]):
            p = d.producers[pid] = Producer(last, ts)
            if off >= 0:
                p.runs.append(Run(last, last, off))
        d._bound()
        return d
