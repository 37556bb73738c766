"""Read planning: options and pushed filters become entry ranges; nothing outside is planned."""
from __future__ import annotations

import pytest

ds = pytest.importorskip("pyspark.sql.datasource")
if not hasattr(ds, "EqualTo"):
    pytest.skip("filter pushdown needs Spark 4.1+", allow_module_level=True)
EqualTo, GreaterThan, GreaterThanOrEqual, In, IsNotNull, LessThan, LessThanOrEqual, Not, StringContains = (
    ds.EqualTo, ds.GreaterThan, ds.GreaterThanOrEqual, ds.In, ds.IsNotNull, ds.LessThan,
    ds.LessThanOrEqual, ds.Not, ds.StringContains)

from pybk.spark.options import parse_ledgers
from pybk.spark.plan import (Bounds, EntryRange, candidate_ledgers, narrow, plan_ranges,
                             select_ledgers, split)


def test_split_cuts_ranges_of_at_most_n_entries():
    assert split(7, 0, 9, 4) == [EntryRange(7, 0, 3), EntryRange(7, 4, 7), EntryRange(7, 8, 9)]
    assert split(7, 5, 5, 4) == [EntryRange(7, 5, 5)]
    assert split(7, 5, 4, 4) == []


def test_plan_covers_closed_and_open_ledgers_up_to_their_last_readable_entry():
    readable = [(3, 99), (1, 9), (2, -1)]  # ledger 2 has no readable entry yet
    parts = plan_ranges(readable, Bounds(), 25)
    assert [(p.ledger_id, p.first, p.last) for p in parts] == [
        (1, 0, 9), (3, 0, 24), (3, 25, 49), (3, 50, 74), (3, 75, 99)]
    assert sum(p.count for p in parts) == 110


def test_between_filter_narrows_the_plan_to_those_entries():
    between = [GreaterThanOrEqual(("entry_id",), 10), LessThanOrEqual(("entry_id",), 19)]
    bounds, rest = narrow(Bounds(), between)
    assert rest == [] and (bounds.entry_lo, bounds.entry_hi) == (10, 19)
    parts = plan_ranges([(1, 99), (2, 14), (3, 5)], bounds, 1000)
    assert parts == [EntryRange(1, 10, 19), EntryRange(2, 10, 14)]


def test_ledger_filters_and_strict_comparisons():
    f = [GreaterThan(("ledger_id",), 1), LessThan(("ledger_id",), 4), LessThan(("entry_id",), 3),
         IsNotNull(("payload",)), IsNotNull(("entry_id",))]
    bounds, rest = narrow(Bounds(), f)
    assert rest == [f[3]]
    assert (bounds.ledger_lo, bounds.ledger_hi, bounds.entry_hi) == (2, 3, 2)
    assert plan_ranges([(1, 9), (2, 9), (3, 9), (4, 9)], bounds, 100) == [
        EntryRange(2, 0, 2), EntryRange(3, 0, 2)]


def test_in_filters_pick_ledgers_exactly_and_narrow_entries_loosely():
    f_ledgers, f_entries = In(("ledger_id",), (5, 7, 9)), In(("entry_id",), (3, 8))
    bounds, rest = narrow(Bounds(), [f_ledgers, f_entries])
    assert rest == [f_entries]  # Spark still drops entries 4..7
    assert bounds.ledger_in == frozenset({5, 7, 9}) and (bounds.entry_lo, bounds.entry_hi) == (3, 8)
    assert candidate_ledgers(parse_ledgers("1-7"), bounds) == [5, 7]
    assert candidate_ledgers(parse_ledgers("all"), Bounds()) is None
    assert candidate_ledgers(parse_ledgers("2,4"), Bounds(ledger_lo=3)) == [4]
    assert select_ledgers([9, 1, 12, 3], parse_ledgers("3-"), Bounds(ledger_hi=10)) == [3, 9]


def test_unsupported_filters_are_returned_as_the_same_objects():
    weird = [Not(EqualTo(("entry_id",), 3)), EqualTo(("entry_id",), "3"),
             StringContains(("payload",), "x"), EqualTo(("other",), 1), EqualTo(("entry_id",), True)]
    bounds, rest = narrow(Bounds(), weird)
    assert bounds == Bounds() and all(a is b for a, b in zip(rest, weird)) and len(rest) == 5


def test_contradictory_filters_plan_nothing():
    bounds, _ = narrow(Bounds(), [EqualTo(("entry_id",), 5), GreaterThan(("entry_id",), 7)])
    assert bounds.empty and plan_ranges([(1, 100)], bounds, 10) == []
    bounds, _ = narrow(Bounds(), [In(("ledger_id",), (1,)), EqualTo(("ledger_id",), 2)])
    assert bounds.empty


def test_sub_ranges_hold_a_few_mib_of_payload():
    from pybk.spark.scan import (ARROW_BATCH_BYTES, MAX_SUB_RANGE, MIN_SUB_RANGE,
                                 sub_range_entries)
    assert sub_range_entries(None) == MIN_SUB_RANGE          # unknown sizes: start small
    assert sub_range_entries(1024) == min(MAX_SUB_RANGE, ARROW_BATCH_BYTES // 1024)
    assert sub_range_entries(64 << 20) == MIN_SUB_RANGE      # huge entries: never fewer than the minimum
    assert sub_range_entries(1) == MAX_SUB_RANGE
