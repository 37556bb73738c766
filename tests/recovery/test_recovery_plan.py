"""Autorecovery's pure decisions: what is missing where, where it goes, and when."""
from __future__ import annotations

from typing import NamedTuple

import pytest

from pybk.ledger import holds
from pybk.recovery import plan
from pybk.recovery.plan import CopyRun, LastFragment


class Frag(NamedTuple):
    first_entry_id: int
    bookies: list[str]


def test_ledgers_referencing_lost_bookies():
    frags = [Frag(0, ["a", "b", "c"]), Frag(10, ["a", "b", "d"])]
    assert plan.fragments_with(frags, {"c"}) == [0]
    assert plan.fragments_with(frags, {"a", "z"}) == [0, 1]
    assert plan.fragments_with(frags, {"z"}) == []
    assert plan.ledger_bookies(frags) == {"a", "b", "c", "d"}
    assert plan.referencing(frags, "d") and not plan.referencing(frags, "z")


def test_missing_entries_against_list_entries_ranges():
    # E3/Qw2, bookie index 1 holds entries with e%3 in {0, 1}
    assert plan.missing_entries(1, 0, 11, 3, 2, [(0, 1), (3, 4), (6, 7), (9, 10)]) == []
    assert plan.missing_entries(1, 0, 11, 3, 2, [(0, 1), (9, 10)]) == [3, 4, 6, 7]
    assert plan.missing_entries(1, 0, 11, 3, 2, []) == [0, 1, 3, 4, 6, 7, 9, 10]
    # extra entries outside the fragment do not matter
    assert plan.missing_entries(0, 5, 8, 3, 3, [(0, 100)]) == []
    assert plan.missing_entries(0, 5, 8, 3, 3, [(0, 5), (8, 9)]) == [6, 7]


def test_fragment_gaps_find_a_wiped_bookie_per_fragment():
    frags = [Frag(0, ["a", "b", "c"]), Frag(10, ["a", "b", "d"])]
    held = {"a": [(0, 19)], "b": [(0, 19)], "c": [(0, 9)], "d": []}
    gaps = plan.fragment_gaps(frags, 3, 3, 19, held)
    assert [(g.fragment, g.bookie, g.missing, g.count) for g in gaps] == [(1, "d", [(10, 19)], 10)]
    # a bookie that could not be asked is left to the lost-bookie path
    assert plan.fragment_gaps(frags, 3, 3, 19, {**held, "d": None}) == []
    # an open ledger is checked up to its LAC only
    assert plan.fragment_gaps(frags, 3, 3, 9, held) == []


def test_placement_violations_are_reported_per_fragment():
    zones = {"a": "z1", "b": "z1", "c": "z2", "d": "z3"}
    frags = [Frag(0, ["a", "b", "c"]), Frag(5, ["a", "c", "d"])]
    v = plan.placement_violations(9, frags, zones)
    assert [(x.ledger_id, x.fragment, x.zones, x.possible) for x in v] == [(9, 0, 2, 3)]
    assert "ledger 9 fragment 0" in str(v[0])
    assert plan.placement_violations(9, frags, {b: "" for b in zones}) == []


def test_copy_runs_read_long_runs_from_surviving_replicas():
    ens = ["a", "b", "c"]
    runs = plan.copy_runs(2, ens, 3, 3, range(0, 1000), batch=256)
    assert [r.count for r in runs] == [256, 256, 256, 232]
    assert all(r.source in {"a", "b"} for r in runs)
    assert sum(r.count for r in runs) == 1000
    # E3/Qw2: lost index 0 holds e%3 in {0, 2}; sources are the other member of each write set
    want = [e for e in range(12) if holds(0, e, 3, 2)]
    runs = plan.copy_runs(0, ens, 3, 2, want)
    for r in runs:
        for e in range(r.first, r.last + 1):
            assert holds(ens.index(r.source), e, 3, 2)
    assert sorted(e for r in runs for e in range(r.first, r.last + 1)) == want
    # a second unavailable replica is avoided; none left is an error naming the entry
    runs = plan.copy_runs(0, ens, 3, 3, range(5), unavailable={"b"})
    assert runs == [CopyRun("c", 0, 4)]
    with pytest.raises(ValueError, match="entry 0"):
        plan.copy_runs(0, ens, 3, 2, [0], unavailable={"b"})


def test_replace_in_fragment_keeps_positions():
    assert plan.replace_in_fragment(["a", "b", "c"], "b", "d") == ["a", "d", "c"]


def test_open_ledger_last_fragment_waits_for_grace_then_recovers():
    assert plan.last_fragment_action(False, 100, 100, 30) is LastFragment.REPLICATE
    assert plan.last_fragment_action(True, 100, 110, 30) is LastFragment.WAIT
    assert plan.last_fragment_action(True, 100, 131, 30) is LastFragment.RECOVER


def test_drain_progress():
    p = plan.drain_progress(10, 4)
    assert (p.done, p.fraction) == (False, 0.6)
    assert plan.drain_progress(3, 5).total == 5
    assert plan.drain_progress(0, 0).done and plan.drain_progress(0, 0).fraction == 1.0
    assert "6/10 ledgers drained" in plan.progress_bar(p)


def test_grace_counts_from_the_writers_last_progress():
    p = plan.writer_progress(None, 10, 100.0)
    assert p == (10, 100.0)
    assert plan.writer_progress(p, 10, 130.0) == (10, 100.0)  # no progress: the clock keeps running
    assert plan.writer_progress(p, 15, 130.0) == (15, 130.0)  # the writer is alive: grace restarts
    since = max(50.0, plan.writer_progress(p, 15, 130.0)[1])
    assert plan.last_fragment_action(True, since, 140.0, 30) is LastFragment.WAIT


def test_a_drained_bookie_may_serve_its_own_entries():
    # Qw = 1: the bookie being drained holds the only copy
    assert plan.copy_runs(1, ["a", "b"], 2, 1, [1, 3, 5], self_source=True, batch=8) == [
        CopyRun("b", 1, 1), CopyRun("b", 3, 3), CopyRun("b", 5, 5)]
    with pytest.raises(ValueError):
        plan.copy_runs(1, ["a", "b"], 2, 1, [1])
