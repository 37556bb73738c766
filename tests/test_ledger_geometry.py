"""Ledger geometry: which bookies store an entry, which entries a fragment covers, entry ids as
ranges, and where a replacement bookie goes."""
from __future__ import annotations

import random
from typing import NamedTuple

from pybk.client.placement import replace_bookies
from pybk.ledger import (entry_ranges, expected_entries, fragment_pieces, fragment_ranges, holds, write_set,
                         write_set_bookies)


class Frag(NamedTuple):
    first_entry_id: int
    bookies: list[str]


def test_write_set_starts_at_entry_mod_ensemble_and_wraps():
    # E=4, Qw=3
    assert [write_set(e, 4, 3) for e in range(6)] == [
        [0, 1, 2], [1, 2, 3], [2, 3, 0], [3, 0, 1], [0, 1, 2], [1, 2, 3]]
    assert write_set(0, 3, 2) == [0, 1]
    assert write_set(2, 3, 2) == [2, 0]
    assert write_set(5, 4, 3) == [1, 2, 3]


def test_write_set_bookies_are_the_ensemble_members_at_the_write_set():
    assert write_set_bookies(2, ["a", "b", "c"], 2) == ["c", "a"]
    assert write_set_bookies(4, ["a", "b", "c", "d"], 4) == ["a", "b", "c", "d"]


def test_a_bookie_holds_an_entry_exactly_when_it_is_in_the_write_set():
    assert all(holds(i, e, 5, 3) == (i in write_set(e, 5, 3)) for i in range(5) for e in range(20))


def test_expected_entries_match_write_sets():
    for E, Qw in [(3, 3), (3, 2), (5, 2), (4, 3), (1, 1)]:
        for i in range(E):
            want = [e for e in range(7, 40) if holds(i, e, E, Qw)]
            assert list(expected_entries(i, 7, 39, E, Qw)) == want


def test_fragment_ranges_end_at_next_first_or_last_entry():
    frags = [Frag(0, ["a", "b", "c"]), Frag(10, ["a", "b", "d"]), Frag(10, ["a", "e", "d"]), Frag(15, ["x", "b", "d"])]
    assert fragment_ranges(frags, 20) == [(0, 9), (10, 9), (10, 14), (15, 20)]
    assert fragment_ranges(frags, -1)[-1] == (15, 14)  # open ledger, nothing in last fragment


def test_fragment_pieces_cut_a_read_at_fragment_boundaries():
    frags = [Frag(0, ["a", "b"]), Frag(10, ["a", "c"]), Frag(10, ["d", "c"]), Frag(15, ["d", "e"])]
    assert fragment_pieces(frags, 5, 17) == [(5, 9, ["a", "b"]), (10, 14, ["d", "c"]), (15, 17, ["d", "e"])]
    assert fragment_pieces(frags, 11, 12) == [(11, 12, ["d", "c"])]
    assert fragment_pieces(frags, 3, 2) == []


def test_entry_ranges_merge_consecutive_ids():
    assert entry_ranges([0, 1, 2, 5, 6, 9]) == [(0, 2), (5, 6), (9, 9)]
    assert entry_ranges([7, 3, 4, 6, 10]) == [(3, 4), (6, 7), (10, 10)]
    assert entry_ranges([4, 4, 5, 5]) == [(4, 5)]
    assert entry_ranges([]) == []


def test_replacement_excludes_ensemble_and_failed_and_prefers_unused_zone():
    zones = {"a": "z1", "b": "z2", "c": "z3", "d": "z1", "e": "z3", "f": "z2", "g": "z4"}
    rng = random.Random(3)
    for _ in range(30):
        new = replace_bookies(zones, ["a", "b", "c"], [1], exclude={"g"}, rng=rng)
        assert new[0] == "a" and new[2] == "c"
        assert new[1] == "f"                               # z2 is the only zone left unused
    new = replace_bookies(zones, ["a", "b", "c"], [0, 2], exclude={"d"}, rng=rng)
    assert new[1] == "b" and not {new[0], new[2]} & {"a", "b", "c", "d"}


def test_replacement_of_a_lost_bookie_is_outside_the_ensemble_and_spreads_zones():
    writable = {"a": "z1", "b": "z2", "c": "z1", "d": "z1", "e": "z3"}
    rng = random.Random(1)
    for _ in range(20):
        r = replace_bookies(writable, ["a", "b", "x"], [2], rng=rng)[2]
        assert r == "e"  # z3 is used by no staying bookie
    assert replace_bookies(writable, ["a", "b", "x"], [2], exclude={"e"}, rng=rng)[2] in {"c", "d"}
    # no zones: any bookie outside the ensemble
    assert replace_bookies({"a": "", "b": "", "c": ""}, ["a", "b"], [1]) == ["a", "c"]

