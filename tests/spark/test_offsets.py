"""Stream offsets {ledger_id: next_entry} and micro-batch planning."""
from __future__ import annotations

import json

import pytest

from pybk.spark.offsets import Loss, LossKind, admit, batch_ranges, data_loss, from_json, to_json, total
from pybk.spark.options import LATEST, Positions
from pybk.spark.plan import EntryRange


def test_offsets_round_trip_through_json():
    off = {12: 5, 3: 0}
    wire = json.loads(json.dumps(to_json(off)))
    assert wire == {"3": 0, "12": 5} and from_json(wire) == off
    with pytest.raises(ValueError, match="bad pybk stream offset"):
        from_json({"x": 1})
    with pytest.raises(ValueError, match="negative"):
        from_json({"1": -2})


def test_without_limit_a_batch_takes_everything_available_and_new_ledgers():
    end = admit({1: 5, 2: 0}, {1: 9, 2: 0, 3: 4}, None)
    assert end == {1: 9, 2: 0, 3: 4}
    assert batch_ranges({1: 5, 2: 0}, end, 100) == [EntryRange(1, 5, 8), EntryRange(3, 0, 3)]
    assert total({1: 5, 2: 0}, end) == 8


def test_limit_bounds_the_batch_and_is_shared_fairly():
    start = {1: 0, 2: 0, 3: 0}
    end = admit(start, {1: 1000, 2: 2, 3: 1000}, 10)
    assert total(start, end) == 10
    assert end[2] == 2 and end[1] >= 4 and end[3] >= 4


def test_repeated_limited_batches_cover_everything_once():
    available = {1: 23, 2: 7}
    start: dict[int, int] = {}
    seen: list[tuple[int, int]] = []
    for _ in range(20):
        end = admit(start, available, 6)
        assert total(start, end) <= 6
        for r in batch_ranges(start, end, 4):
            seen.extend((r.ledger_id, e) for e in range(r.first, r.last + 1))
        if end == start:
            break
        start = end
    assert sorted(seen) == [(1, e) for e in range(23)] + [(2, e) for e in range(7)]
    assert len(seen) == len(set(seen))


def test_offsets_never_move_backwards_and_first_entry_applies_to_new_ledgers():
    assert admit({1: 10}, {1: 3}, None) == {1: 10}
    assert admit({1: 10}, {}, 5) == {1: 10}
    assert admit({}, {4: 9}, None, first_entry=5) == {4: 9}
    assert batch_ranges({}, {4: 9}, 100, first_entry=5) == [EntryRange(4, 5, 8)]


def test_ledgers_found_later_start_where_the_options_say_and_replays_plan_the_same():
    starting = Positions(LATEST, ((7, 3), (8, LATEST)))
    end = admit({1: 5}, {1: 9, 7: 10, 8: 4, 9: 2}, None, starting)
    assert end == {1: 9, 7: 10, 8: 4, 9: 2}
    # 7: its entry id; 8 (latest) and 9 (default latest): found after the start, so all of it is new
    assert batch_ranges({1: 5}, end, 100, starting) == [
        EntryRange(1, 5, 8), EntryRange(7, 3, 9), EntryRange(8, 0, 3), EntryRange(9, 0, 1)]
    assert batch_ranges({1: 5}, end, 100, starting, min_partitions=6) == batch_ranges({1: 5}, end, 100, starting, 6)
    assert len(batch_ranges({1: 5}, end, 100, starting, min_partitions=6)) >= 6


def test_data_loss_is_a_deleted_ledger_or_a_readable_end_that_moved_back():
    start = {1: 5, 2: 7, 3: 0}
    assert data_loss(start, {1: 9, 2: 7, 3: 0, 4: 1}, {1: 9, 2: 7}) == []
    losses = data_loss(start, {1: 9, 3: 0}, {2: 10})
    assert losses == [Loss(2, LossKind.DELETED, 7)]
    msg = losses[0].message()
    assert msg.startswith("data loss: ledger 2 was deleted") and "failOnDataLoss=false" in msg
    shortened = data_loss({1: 5}, {1: 4}, {1: 9})
    assert shortened == [Loss(1, LossKind.SHORTENED, 5, 3)] and "up to entry 3" in shortened[0].message()
