"""The pure decisions of named logs: transitions, truncation prefix, orphans, retention, dedup, and the
entries a tailing reader holds from its LAC answers."""
from __future__ import annotations

from dataclasses import replace

from pybk.log.dedup import Dedup, Duplicate, Forgotten
from pybk.log.layout import (Conflict, Cursor, Head, Keys, LogState, Segment, SegmentState, SegmentSummary,
                             after_head_conflict, config_bytes, config_from_bytes, ledger_custom, ledger_owner,
                             open_next, orphan_reason, seal, take_over, truncation_prefix)
from pybk.log.options import LogConfig, Retention, RetentionPolicy
from pybk.log.reader import Ahead
from pybk.log.retention import retention_before

HOUR = 3600 * 1000


def closed(seq: int, first: int, records: int, max_ts: int = 0, size: int = 100) -> Segment:
    return Segment(seq, 100 + seq, SegmentState.CLOSED, 1, first, records, size, max_ts, max_ts, records - 1)


def log_of(*records: int, open_last: bool = True) -> list[Segment]:
    out, first = [], 0
    for i, n in enumerate(records):
        out.append(closed(i, first, n, max_ts=i * HOUR))
        first += n
    if open_last:
        out.append(Segment(len(records), 200, SegmentState.OPEN, 1, first))
    return out


def test_values_round_trip_through_their_bytes():
    h = Head(3, "w", LogState.ACTIVE, 7, 42)
    assert Head.from_bytes(h.to_bytes()) == h
    s = replace(closed(3, 30, 10), dedup=b"\x00\x01")
    assert Segment.from_bytes(s.to_bytes()) == s
    assert Cursor.from_bytes("c", Cursor("c", 9).to_bytes()) == Cursor("c", 9)
    cfg = LogConfig(retention=Retention(RetentionPolicy.LIMITS, max_age=60.0))
    assert LogConfig.from_json(cfg.to_json()) == cfg


def test_an_idle_log_costs_under_a_kilobyte_of_keys_and_values():
    keys = Keys(b"/pybk/")
    log_id, name = 123456, "orders"
    stored = {keys.name(name): b"%d" % log_id,
              keys.config(log_id): config_bytes(name, LogConfig(), b"\xab" * 32),
              keys.head(log_id): Head(1, "a-host-name:12345", last_seq=0).to_bytes(),
              keys.writer(log_id): b"a-host-name:12345",
              keys.segment(log_id, 0): Segment(0, 1234, SegmentState.OPEN, 1, 0, created_ms=1700000000000,
                                               producer=7).to_bytes(),
              keys.cursor(log_id, "billing"): Cursor("billing", 10).to_bytes()}
    assert sum(len(k) + len(v) for k, v in stored.items()) < 1024
    assert config_from_bytes(stored[keys.config(log_id)]) == (LogConfig(), b"\xab" * 32)


def test_open_takes_the_next_epoch_and_the_next_sequence():
    head = take_over(Head(2, "old", last_seq=4), "new")
    assert (head.epoch, head.writer) == (3, "new")
    new_head, seg = open_next(head, 3, 77, first_offset=120, now_ms=5)
    assert new_head.last_seq == 5 and (seg.seq, seg.ledger_id, seg.state, seg.first_offset) == (5, 77, SegmentState.OPEN, 120)
    sealed = seal(Segment(4, 70, SegmentState.OPEN, 2, 100), SegmentSummary(20, 999, 1, 2, 19))
    assert (sealed.state, sealed.end_offset, sealed.last_entry) == (SegmentState.CLOSED, 120, 19)


def test_a_lost_head_cas_is_retried_only_while_the_epoch_is_still_ours():
    assert after_head_conflict(Head(3, start_offset=50), 3) is Conflict.RETRY
    assert after_head_conflict(Head(4), 3) is Conflict.FENCED
    assert after_head_conflict(Head(3, state=LogState.DELETING), 3) is Conflict.FENCED
    assert after_head_conflict(None, 3) is Conflict.FENCED


def test_truncation_takes_a_prefix_of_closed_segments_below_the_offset_never_the_open_one():
    segs = log_of(10, 10, 10)
    assert [s.seq for s in truncation_prefix(segs, 25)] == [0, 1]
    assert [s.seq for s in truncation_prefix(segs, 10**9)] == [0, 1, 2]
    assert truncation_prefix(segs, 5) == []
    half_done = [replace(segs[0], state=SegmentState.TRUNCATED), *segs[1:]]
    assert [s.seq for s in truncation_prefix(half_done, 0)] == [0]     # an interrupted truncation finishes


def test_orphans_are_told_from_live_and_pending_ledgers():
    head = Head(5, last_seq=3)
    seg = Segment(3, 30, SegmentState.OPEN, 5, 0)
    assert orphan_reason(30, 3, 5, head, seg) == ""
    assert orphan_reason(31, 3, 4, head, seg) == "segment 3 was committed with ledger 30"
    assert orphan_reason(32, 4, 5, head, None) == ""                      # the live writer's next ledger
    assert "fenced by epoch 5" in orphan_reason(33, 4, 4, head, None)
    assert "never committed" in orphan_reason(34, 2, 5, head, None)
    assert orphan_reason(30, 3, 5, None, None) == "its log no longer exists"
    assert orphan_reason(30, 3, 5, replace(head, state=LogState.DELETING), seg) == "its log is being deleted"
    assert orphan_reason(30, 3, 5, head, replace(seg, state=SegmentState.TRUNCATED)) == "its segment was truncated"
    assert ledger_owner(ledger_custom(9, 3, 5)) == (9, 3, 5) and ledger_owner({}) is None


def test_limits_retention_deletes_old_or_excess_closed_segments_only():
    segs = log_of(10, 10, 10)                     # newest records at 0 h, 1 h, 2 h; 100 bytes each
    now = 3 * HOUR
    assert retention_before(Retention(RetentionPolicy.LIMITS, max_age=2.5 * 3600), segs, now, []) == 10
    assert retention_before(Retention(RetentionPolicy.LIMITS, max_bytes=150), segs, now, []) == 20
    assert retention_before(Retention(RetentionPolicy.LIMITS), segs, now, []) is None
    assert retention_before(Retention(RetentionPolicy.LIMITS, max_age=0), segs, now, []) == 30   # not the open one
    assert retention_before(Retention(RetentionPolicy.NONE, max_age=0), segs, now, []) is None


def test_interest_retention_never_deletes_at_or_above_the_lowest_cursor():
    segs = log_of(10, 10, 10)
    interest = Retention(RetentionPolicy.INTEREST)
    assert retention_before(interest, segs, 0, [25, 19]) == 10
    assert retention_before(interest, segs, 0, [20]) == 20
    assert retention_before(interest, segs, 0, [9]) is None
    assert retention_before(interest, segs, 0, []) is None
    assert retention_before(replace(interest, max_backlog_bytes=100), segs, 0, [0]) == 20   # the escape hatch


def test_dedup_answers_duplicates_with_their_offsets_and_forgets_beyond_its_bounds():
    d = Dedup(max_producers=2, idle_ms=1000, window=2)
    d.record(1, 0, 5, 100, 10, ack="entry a")      # producer 1: sequences 0..4 at offsets 100..104
    d.record(1, 5, 5, 105, 20, ack="entry b")
    assert d.check(1, 7) == Duplicate(107, "entry b")
    assert d.check(1, 10) is None and d.next_sequence(1) == 10
    d.record(1, 10, 1, 110, 30, ack="entry c")     # a third entry: the first falls out of the window
    assert d.check(1, 2) == Forgotten(10)
    d.record(2, 0, 1, 111, 40)
    d.record(3, 0, 1, 112, 50)                     # a third producer: the least recent (1) goes
    assert list(d.producers) == [2, 3]
    assert d.expire(now_ms=1045) == 1 and list(d.producers) == [3]
    again = Dedup.from_snapshot(d.snapshot())
    assert again.check(3, 0) == Duplicate(112, None) and again.next_sequence(3) == 1
    assert Dedup.from_snapshot(b"\x01" * 7).producers == {}    # a truncated snapshot is ignored, not misread


def test_entries_that_came_with_the_lac_are_handed_out_once_in_order():
    a = Ahead()
    a.put(5, [b"e5", b"e6"])
    a.put(7, [b"e7"])                              # the next answer follows on
    assert a.take(4, 9) == []                      # not from 4: read as usual, the rest stays
    assert a.take(5, 5) == [b"e5"]
    assert a.take(6, 9) == [b"e6", b"e7"] and a.payloads == []
    a.put(9, [b"e9"])
    a.put(12, [b"e12"])                            # not following on: instead of what was held
    assert a.take(9, 12) == [] and a.take(12, 12) == [b"e12"]
    a.put(13, [b"e13"])
    assert a.take(14, 20) == [] and a.payloads == []   # read past it: it goes
