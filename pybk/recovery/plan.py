"""Pure decisions of autorecovery: what is under-replicated, where to copy it, and when.

No I/O here. The auditor, the replication worker and decommission feed these functions what
they read from etcd and from the bookies' `ListEntries`, and act on the answers. The ledger
geometry they build on (write sets, fragment ranges, entry-id ranges) is `pybk.ledger`, and
where a replacement goes is `pybk.client.placement.replace_bookies`.
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Iterable, Iterator, Mapping, Sequence

from pybk.ledger import FragmentLike, Range, entry_ranges, expected_entries, fragment_ranges, write_set_bookies


def ledger_bookies(fragments: Sequence[FragmentLike]) -> set[str]:
    """Every bookie any fragment of a ledger names."""
    return {b for f in fragments for b in f.bookies}


def fragments_with(fragments: Sequence[FragmentLike], bookies: Iterable[str]) -> list[int]:
    """Indices of the fragments whose ensemble names any of `bookies`."""
    wanted = set(bookies)
    return [i for i, f in enumerate(fragments) if wanted.intersection(f.bookies)]


def _gaps(held: Sequence[Range], first: int, last: int) -> Iterator[Range]:
    """Sub-ranges of [first, last] not covered by the sorted inclusive ranges in held."""
    cursor = first
    for a, b in sorted(held):
        if b < cursor:
            continue
        if a > last:
            break
        if a > cursor:
            yield cursor, min(a - 1, last)
        cursor = max(cursor, b + 1)
        if cursor > last:
            return
    if cursor <= last:
        yield cursor, last


def missing_entries(index: int, first: int, last: int, ensemble_size: int, write_quorum: int,
                    held: Sequence[Range]) -> list[int]:
    """Entries of [first, last] the bookie at `index` should hold but does not, given the
    inclusive ranges its ListEntries reported."""
    out: list[int] = []
    for a, b in _gaps(held, first, last):
        out.extend(expected_entries(index, a, b, ensemble_size, write_quorum))
    return out


@dataclasses.dataclass(frozen=True)
class FragmentGap:
    """Replicas missing in one fragment: entries the bookie at ensemble index should hold."""

    fragment: int
    bookie: str
    missing: list[Range]

    @property
    def count(self) -> int:
        return sum(b - a + 1 for a, b in self.missing)


def fragment_gaps(fragments: Sequence[FragmentLike], ensemble_size: int, write_quorum: int,
                  last_entry_id: int, held: Mapping[str, Sequence[Range] | None]) -> list[FragmentGap]:
    """Under-replication of a ledger found by the periodic check.

    held maps bookie id -> its ListEntries ranges for this ledger (empty for NO_LEDGER), or None
    when the bookie could not be asked (down: the lost-bookie path deals with it, not this one).
    """
    gaps: list[FragmentGap] = []
    for fi, (first, last) in enumerate(fragment_ranges(fragments, last_entry_id)):
        if last < first:
            continue
        for index, bookie in enumerate(fragments[fi].bookies):
            ranges = held.get(bookie)
            if ranges is None:
                continue
            missing = missing_entries(index, first, last, ensemble_size, write_quorum, ranges)
            if missing:
                gaps.append(FragmentGap(fi, bookie, entry_ranges(missing)))
    return gaps


@dataclasses.dataclass(frozen=True)
class PlacementViolation:
    """A fragment whose ensemble spans fewer zones than it could."""

    ledger_id: int
    fragment: int
    zones: int
    possible: int

    def __str__(self) -> str:
        return (f"ledger {self.ledger_id} fragment {self.fragment}: ensemble spans {self.zones} zone(s), "
                f"{self.possible} possible")


def placement_violations(ledger_id: int, fragments: Sequence[FragmentLike],
                         zones: Mapping[str, str]) -> list[PlacementViolation]:
    """Fragments whose bookies use fewer distinct zones than min(E, zones available).

    zones maps every known bookie id to its zone ("" for none); with no zones advertised there
    is nothing to check. Bookies of unknown zone count as a zone of their own.
    """
    available = {z for z in zones.values() if z}
    if not available:
        return []
    out = []
    for fi, frag in enumerate(fragments):
        spanned = {zones.get(b) or f"?{b}" for b in frag.bookies}
        possible = min(len(frag.bookies), len(available))
        if len(spanned) < possible:
            out.append(PlacementViolation(ledger_id, fi, len(spanned), possible))
    return out


@dataclasses.dataclass(frozen=True)
class CopyRun:
    """Consecutive entries to read from one source bookie and write to the target."""

    source: str
    first: int
    last: int

    @property
    def count(self) -> int:
        return self.last - self.first + 1


@dataclasses.dataclass(frozen=True)
class FragmentCopy:
    """How to restore one bookie's share of one fragment on a target bookie."""

    fragment: int
    lost: str          # the ensemble member whose replicas are missing
    target: str        # where they go (a replacement, or `lost` itself when it is back but empty)
    runs: list[CopyRun]

    @property
    def entries(self) -> int:
        return sum(r.count for r in self.runs)


def copy_runs(index: int, ensemble: Sequence[str], ensemble_size: int, write_quorum: int,
              entries: Iterable[int], unavailable: Iterable[str] = (), batch: int = 512,
              spread: int = 0, self_source: bool = False) -> list[CopyRun]:
    """Read plan for restoring the replicas of the bookie at `index`: for each entry a source
    among the other members of its write set that is not unavailable, grouped into runs of
    consecutive entries with one source, at most `batch` entries each. With self_source the
    bookie at `index` may be a source too (it is being drained, not lost: with Qw = 1 it holds
    the only copy).

    `spread` rotates the choice of source so concurrent copies do not all hit one bookie.
    Raises ValueError naming the entry when no source is left (data loss beyond Qw - 1).
    """
    bad = set(unavailable)
    if not self_source:
        bad.add(ensemble[index])
    by_residue = [[b for b in write_set_bookies(r, ensemble, write_quorum) if b not in bad]
                  for r in range(ensemble_size)]  # the write set depends only on e % E
    runs: list[CopyRun] = []
    for e in entries:
        members = by_residue[e % ensemble_size]
        if not members:
            raise ValueError(f"entry {e} has no surviving replica outside {sorted(bad)}")
        # Keep the previous run's source while it holds the entry: long runs, few reads.
        prev = runs[-1] if runs else None
        if prev and prev.last + 1 == e and prev.source in members and prev.count < batch:
            runs[-1] = CopyRun(prev.source, prev.first, e)
            continue
        source = members[(spread + e // max(batch, 1)) % len(members)]
        runs.append(CopyRun(source, e, e))
    return runs


def replace_in_fragment(bookies: Sequence[str], lost: str, target: str) -> list[str]:
    """The fragment's ensemble with `lost` replaced by `target` (same position)."""
    return [target if b == lost else b for b in bookies]


class LastFragment(enum.Enum):
    """What a worker may do about an under-replicated last fragment of a ledger."""

    REPLICATE = "replicate"  # closed ledger or fragment: copy now
    WAIT = "wait"            # open ledger inside the grace period: its writer may still fix it
    RECOVER = "recover"      # open ledger, grace elapsed: fence and recover (close) it, then copy


def last_fragment_action(state_open: bool, marked_since_s: float, now_s: float, grace_s: float) -> LastFragment:
    """Whether an open ledger's last fragment may be replicated now.

    A live writer replaces a failed bookie itself (ensemble change) as soon as an add fails,
    so a last fragment that still names a lost bookie after the grace period belongs to a writer
    that is idle or gone: fence the ledger (recovery closes it) and replicate. Callers pass as
    marked_since_s the later of the marker's time and the writer's last progress (writer_progress).
    """
    if not state_open:
        return LastFragment.REPLICATE
    if now_s - marked_since_s < grace_s:
        return LastFragment.WAIT
    return LastFragment.RECOVER


def writer_progress(previous: tuple[int, float] | None, lac: int, now_s: float) -> tuple[int, float]:
    """(highest LAC seen, when it last rose) after observing `lac` at now_s. A writer whose LAC
    keeps rising is alive: the grace period counts from its last progress, not from the marker."""
    if previous is None or lac > previous[0]:
        return lac, now_s
    return previous


def referencing(fragments: Sequence[FragmentLike], bookie: str) -> bool:
    """Whether any fragment of a ledger still names the bookie (decommission is not done)."""
    return any(bookie in f.bookies for f in fragments)


@dataclasses.dataclass(frozen=True)
class DrainProgress:
    """Decommission progress: ledgers that referenced the bookie at the start vs now."""

    total: int
    remaining: int

    @property
    def done(self) -> bool:
        return self.remaining == 0

    @property
    def fraction(self) -> float:
        if self.total <= 0:
            return 1.0
        return max(0.0, min(1.0, (self.total - self.remaining) / self.total))


def drain_progress(initial: int, remaining: int) -> DrainProgress:
    """Progress of a drain; new ledgers placed on the bookie meanwhile count into the total."""
    return DrainProgress(max(initial, remaining), remaining)


def progress_bar(p: DrainProgress, width: int = 30) -> str:
    """A one-line text progress bar for the shell."""
    filled = int(round(p.fraction * width))
    return f"[{'#' * filled}{'.' * (width - filled)}] {p.total - p.remaining}/{p.total} ledgers drained"
