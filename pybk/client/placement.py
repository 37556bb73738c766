"""Where a ledger's entries go: random among writable bookies, spread across zones.

Pure functions over `{bookie_id: zone}` (zone None or "" when a bookie advertises none). The
client places new ensembles and ensemble changes here, and autorecovery its replacements.
"""
from __future__ import annotations

import random
from collections import Counter
from typing import Iterable, Mapping, Sequence

from .errors import NotEnoughBookiesError


def _by_zone(ids: Iterable[str], zones: Mapping[str, str | None], rng: random.Random) -> list[list[str]]:
    groups: dict[str, list[str]] = {}
    for b in ids:
        groups.setdefault(zones.get(b) or "", []).append(b)
    out = list(groups.values())
    for g in out:
        rng.shuffle(g)
    rng.shuffle(out)
    return out


def choose_ensemble(writable: Mapping[str, str | None], size: int,
                    exclude: Iterable[str] = (), rng: random.Random | None = None) -> list[str]:
    """Pick `size` distinct bookies at random, taking one per zone in turn so that an
    ensemble spans as many zones as the writable bookies offer."""
    rng = rng or random.Random()
    excluded = set(exclude)
    candidates = [b for b in writable if b not in excluded]
    if len(candidates) < size:
        raise NotEnoughBookiesError(size, len(candidates),
                                    f"{len(excluded)} excluded" if excluded else "")
    groups = _by_zone(candidates, writable, rng)
    chosen: list[str] = []
    while len(chosen) < size:
        for g in groups:
            if g and len(chosen) < size:
                chosen.append(g.pop())
    rng.shuffle(chosen)
    return chosen


def replace_bookies(writable: Mapping[str, str | None], ensemble: Sequence[str], replace: Iterable[int],
                    exclude: Iterable[str] = (), rng: random.Random | None = None) -> list[str]:
    """A new ensemble with the bookies at indices `replace` swapped for writable bookies that
    are neither in the ensemble nor in `exclude` (failed, lost or draining bookies).

    Zone rule, the one of BookKeeper's rack-aware replacement: each replacement comes from the
    zone the rest of the ensemble uses least, so a zone no other member uses when there is one,
    else the least crowded; random among equals. Bookies that advertise no zone share the zone
    "", as in `choose_ensemble` (BookKeeper's default rack). The writer's ensemble change and
    autorecovery both place replacements here, so a ledger is spread the same way whichever of
    them replaced a bookie. Raises NotEnoughBookiesError when too few candidates are left.
    """
    rng = rng or random.Random()
    idx = sorted(set(replace))
    banned = set(ensemble) | set(exclude)
    candidates = [b for b in writable if b not in banned]
    if len(candidates) < len(idx):
        raise NotEnoughBookiesError(len(idx), len(candidates),
                                    f"replacing {len(idx)} of ensemble {list(ensemble)}; "
                                    f"{len(writable)} writable, excluding the ensemble and failed bookies")
    new = list(ensemble)
    kept = [b for i, b in enumerate(ensemble) if i not in idx]
    used = Counter(writable.get(b) or "" for b in kept)
    for i in idx:
        rng.shuffle(candidates)
        best = min(candidates, key=lambda b: used[writable.get(b) or ""])
        candidates.remove(best)
        used[writable.get(best) or ""] += 1
        new[i] = best
    return new
