"""Ledger geometry: which bookies of a fragment's ensemble store an entry, which entries each
fragment covers, and entry ids as ranges. Pure and I/O-free; the client, the metadata model,
autorecovery, the bookie and the shell all take these rules from here.

Striping (the model of BookKeeper's round-robin distribution schedule): entry `e` of a fragment
with ensemble `[b0 .. bE-1]` is stored on the `Qw` bookies starting at index `e % E`, wrapping.
Indices are positions in the ensemble (0 .. E-1), never bookie ids.

Fragments are any objects with `first_entry_id` and `bookies` (`pybk.meta.Fragment`); a fragment
holds the entries from its first id up to the next fragment's first id, the last one up to the
ledger's last entry.
"""
from __future__ import annotations

from typing import Iterable, Iterator, Protocol, Sequence

Range = tuple[int, int]  # inclusive entry id range (first, last); empty when last < first


class FragmentLike(Protocol):
    first_entry_id: int
    bookies: Sequence[str]


def write_set(entry_id: int, ensemble_size: int, write_quorum: int) -> list[int]:
    """Ensemble indices that store `entry_id`: `write_quorum` of them from `entry_id % E`, wrapping."""
    start = entry_id % ensemble_size
    return [(start + i) % ensemble_size for i in range(write_quorum)]


def write_set_bookies(entry_id: int, ensemble: Sequence[str], write_quorum: int) -> list[str]:
    """The bookies of `ensemble` that store `entry_id`, in write-set order."""
    return [ensemble[i] for i in write_set(entry_id, len(ensemble), write_quorum)]


def holds(index: int, entry_id: int, ensemble_size: int, write_quorum: int) -> bool:
    """Whether the bookie at `index` of the ensemble is in `entry_id`'s write set."""
    return (index - entry_id) % ensemble_size < write_quorum


def expected_entries(index: int, first: int, last: int, ensemble_size: int, write_quorum: int) -> Iterator[int]:
    """Entry ids in [first, last] that the bookie at `index` of the ensemble stores, ascending."""
    if write_quorum >= ensemble_size:
        yield from range(first, last + 1)
        return
    residues = sorted((index - k) % ensemble_size for k in range(write_quorum))
    base = first - first % ensemble_size
    while base <= last:
        for r in residues:
            e = base + r
            if first <= e <= last:
                yield e
        base += ensemble_size


def fragment_ranges(fragments: Sequence[FragmentLike], last_entry_id: int) -> list[Range]:
    """Entry range of each fragment: its first id .. the next fragment's first id - 1; the last
    fragment ends at `last_entry_id` (a closed ledger's last entry, or what is known of an open
    one: its LAC, or -1). A fragment that holds no entry gets the empty range (first, first - 1)."""
    out: list[Range] = []
    for i, frag in enumerate(fragments):
        first = frag.first_entry_id
        last = fragments[i + 1].first_entry_id - 1 if i + 1 < len(fragments) else last_entry_id
        out.append((first, max(last, first - 1)))
    return out


def fragment_pieces(fragments: Sequence[FragmentLike], first: int, last: int) -> list[tuple[int, int, list[str]]]:
    """Entries first..last cut at fragment boundaries: (a, b, ensemble) for each fragment that
    holds any of them, in order."""
    out = []
    for frag, (a, b) in zip(fragments, fragment_ranges(fragments, last)):
        a, b = max(first, a), min(last, b)
        if a <= b:
            out.append((a, b, list(frag.bookies)))
    return out


def entry_ranges(entry_ids: Iterable[int]) -> list[Range]:
    """Entry ids (any order, repeats allowed) as sorted, disjoint inclusive ranges."""
    ranges: list[Range] = []
    for e in sorted(entry_ids):
        if ranges and e <= ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], max(e, ranges[-1][1]))
        else:
            ranges.append((e, e))
    return ranges
