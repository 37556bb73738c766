"""Read planning: options and pushed filters become entry ranges; nothing outside is planned."""
from __future__ import annotations

import pytest

ds = pytest.importorskip("pyspark.sql.datasource")
if not hasattr(ds, "EqualTo"):
    pytest.skip("filter pushdown needs Spark 4.1+", allow_module_level=True)
EqualTo, GreaterThan, GreaterThanOrEqual, In, IsNotNull, LessThan, LessThanOrEqual, Not, StringContains = (
    ds.EqualTo, ds.GreaterThan, ds.GreaterThanOrEqual, ds.In, ds.IsNotNull, ds.LessThan,
    ds.LessThanOrEqual, ds.Not, ds.StringContains)

from pybk.spark.options import EARLIEST, LATEST, Positions, parse_ledgers
from pybk.spark.plan import (Bounds, EntryRange, candidate_ledgers, narrow, plan_ranges,
                             select_ledgers, split, split_all, window)


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


def test_in_filters_plan_one_small_range_per_value():
    f_ledgers, f_entries = In(("ledger_id",), (5, 7, 9)), In(("entry_id",), (4000, 5, 6, 3))
    bounds, rest = narrow(Bounds(), [f_ledgers, f_entries])
    assert rest == []  # enforced exactly by planning
    assert bounds.ledger_in == frozenset({5, 7, 9}) and bounds.entry_in == frozenset({3, 5, 6, 4000})
    assert plan_ranges([(5, 9999), (7, 4)], bounds, 100) == [
        EntryRange(5, 3, 3), EntryRange(5, 5, 6), EntryRange(5, 4000, 4000), EntryRange(7, 3, 3)]
    narrower, _ = narrow(bounds, [GreaterThan(("entry_id",), 3), In(("entry_id",), (5, 4000, 7))])
    assert plan_ranges([(5, 9999)], narrower, 100) == [EntryRange(5, 5, 5), EntryRange(5, 4000, 4000)]
    assert narrow(Bounds(), [In(("entry_id",), (1,)), GreaterThan(("entry_id",), 1)])[0].empty
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


def test_per_ledger_offsets_select_each_ledgers_window():
    starting = Positions(EARLIEST, ((12, 100), (13, EARLIEST), (14, LATEST)))
    ending = Positions(LATEST, ((12, 150), (13, 5)))
    assert window(starting, ending, 12, 999) == (100, 149)      # ending positions are exclusive
    assert window(starting, ending, 13, 999) == (0, 4)
    assert window(starting, ending, 14, 999) == (1000, 999)     # latest: nothing yet
    assert window(starting, ending, 15, 20) == (0, 20)          # not named: earliest to latest
    assert window(starting, ending, 12, 120) == (100, 120)      # capped by what is readable
    parts = plan_ranges([(12, 999), (13, 999), (14, 999), (15, 20)], Bounds(), 1000, starting, ending)
    assert parts == [EntryRange(12, 100, 149), EntryRange(13, 0, 4), EntryRange(15, 0, 20)]
    bounds, _ = narrow(Bounds(), [GreaterThanOrEqual(("entry_id",), 140)])
    assert plan_ranges([(12, 999), (13, 999)], bounds, 1000, starting, ending) == [EntryRange(12, 140, 149)]


def test_min_partitions_splits_ranges_further_when_entries_allow():
    ranges = [EntryRange(1, 0, 99), EntryRange(2, 0, 9)]
    parts = split_all(ranges, 1000, min_partitions=8)
    assert len(parts) >= 8 and sum(p.count for p in parts) == 110
    assert sorted((p.ledger_id, e) for p in parts for e in range(p.first, p.last + 1)) == [
        (1, e) for e in range(100)] + [(2, e) for e in range(10)]
    assert len(split_all([EntryRange(1, 0, 4)], 1000, min_partitions=4)) >= 4
    assert len(split_all([EntryRange(1, 0, 2)], 1000, min_partitions=10)) == 3   # one entry each at most
    assert split_all(ranges, 1000) == ranges and len(split_all(ranges, 1000, 2)) == 3
    assert len(plan_ranges([(1, 99)], Bounds(), 1000, min_partitions=5)) == 5
