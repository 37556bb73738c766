"""Retention as a pure decision: given a log's segments (in order), its policy, the time and its
cursors, up to which offset whole closed segments may be deleted. `Logs.enforce_retention` applies
the answer with `truncate`, which deletes only a prefix of CLOSED segments."""
from __future__ import annotations

from typing import Sequence

from .layout import Segment, SegmentState
from .options import Retention, RetentionPolicy


def retention_before(retention: Retention, segments: Sequence[Segment], now_ms: int,
                     cursors: Sequence[int]) -> int | None:
    """The offset to truncate before (every record below it may go), or None to delete nothing.

    LIMITS: the oldest closed segments go while their newest record is older than max_age, or
    while the closed segments kept hold more than max_bytes. INTEREST: a closed segment goes only
    if every record in it is below the lowest cursor (no cursor: nothing goes), or, with
    max_backlog_bytes, while more than that is kept. NONE: nothing goes."""
    live = [s for s in segments if s.state is not SegmentState.TRUNCATED]
    kept = sum(s.bytes for s in live)
    before = None
    lowest = min(cursors) if cursors else None
    for s in live:
        if s.state is not SegmentState.CLOSED:
            break
        if retention.policy is RetentionPolicy.LIMITS:
            old = retention.max_age is not None and (s.records == 0 or s.max_ts < now_ms - retention.max_age * 1000)
            big = retention.max_bytes is not None and kept > retention.max_bytes
            go = old or big
        elif retention.policy is RetentionPolicy.INTEREST:
            consumed = lowest is not None and s.end_offset <= lowest
            over = retention.max_backlog_bytes is not None and kept > retention.max_backlog_bytes
            go = consumed or over
        else:
            go = False
        if not go:
            break
        kept -= s.bytes
        before = s.end_offset
    return before
