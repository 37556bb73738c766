"""The writer's ensemble change: the failed bookies of the last fragment are replaced by a
metadata update that appends a fragment at the first un-acked entry, then the replacements are
connected. The decisions are pure (`next_ensemble`, `append_fragment`); `change_ensemble` does
the I/O; the handle applies the stored change to its pipeline (resending what the new bookies
lack)."""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, Mapping

from pybk.client.bookie_client import BookieClient
from pybk.meta.ledgers import Change, Fragment, LedgerMetadata, LedgerState, Unchanged

from .errors import BKError, LedgerClosedError, LedgerFencedError, NotEnoughBookiesError
from .placement import replace_bookies

if TYPE_CHECKING:
    from .bookkeeper import BookKeeper

log = logging.getLogger("pybk.client")


def with_fragment(md: LedgerMetadata, first_entry_id: int, bookies: list[str]) -> LedgerMetadata:
    """Metadata with a new last fragment from `first_entry_id` (replacing a last fragment
    that starts there already, whose entries were never acked)."""
    frags = list(md.fragments)
    if frags and frags[-1].first_entry_id == first_entry_id:
        frags.pop()
    frags.append(Fragment(first_entry_id, list(bookies)))
    return md.replace(fragments=frags)


def next_ensemble(metadata: LedgerMetadata, failed: Iterable[int], writable: Mapping[str, str | None],
                  exclude: Iterable[str] = ()) -> list[str]:
    """The last fragment's ensemble with the bookies at indices `failed` replaced by writable
    bookies neither in it nor in `exclude`; NotEnoughBookiesError if too few are left."""
    return replace_bookies(writable, list(metadata.current_ensemble), failed, exclude=exclude)


def append_fragment(first_entry: int, failed: Iterable[int], writable: Mapping[str, str | None],
                    exclude: Iterable[str] = ()) -> Change[LedgerState]:
    """The ensemble change as a metadata change: an OPEN ledger gets a last fragment from
    `first_entry` on `next_ensemble`; a ledger no longer OPEN (a reader recovers or closed it)
    is left as it is, with its state as the reason."""
    failed, exclude = frozenset(failed), frozenset(exclude)

    def change(md: LedgerMetadata) -> LedgerMetadata | Unchanged[LedgerState]:
        if md.state is not LedgerState.OPEN:
            return Unchanged(md.state)
        return with_fragment(md, first_entry, next_ensemble(md, failed, writable, exclude))
    return change


def not_open_error(md: LedgerMetadata) -> BKError:
    """The error a writer fails with when it finds its ledger no longer OPEN."""
    if md.is_closed:
        return LedgerClosedError(f"ledger {md.ledger_id} was closed by someone else at entry {md.last_entry_id}")
    return LedgerFencedError(f"ledger {md.ledger_id} is being recovered by a reader: this writer is fenced")


@dataclass
class EnsembleChange:
    """The end of one ensemble change: `metadata` as stored now; unless `not_open` (the state
    found instead of OPEN: nothing was changed), the ensemble indices whose bookie changed and a
    client for each (None: the replacement could not be reached)."""

    metadata: LedgerMetadata
    not_open: LedgerState | None = None
    replaced: set[int] = field(default_factory=set)
    clients: dict[int, BookieClient | None] = field(default_factory=dict)


async def change_ensemble(bk: "BookKeeper", md: LedgerMetadata, ensemble: list[str], failed: set[int],
                          first_entry: int, exclude: set[str]) -> EnsembleChange:
    """Replace the bookies at indices `failed` of `ensemble` (the writer's last fragment) from
    `first_entry` on, then connect to the new ones. Bookies in `exclude` (every one the writer
    gave up on) are avoided; if that leaves too few, they are allowed again after a pause (a
    failed one may be back, restarted or only briefly unreachable: better than none, and the
    pause keeps a dead one from being retried hot). NotEnoughBookiesError if still too few."""
    update = bk.store.ledgers.update
    try:
        result = await update(md.ledger_id, append_fragment(first_entry, failed, await bk.writable_bookies(),
                                                            exclude), current=md)
    except NotEnoughBookiesError:
        await asyncio.sleep(0.5)
        result = await update(md.ledger_id, append_fragment(first_entry, failed, await bk.writable_bookies()),
                              current=md)
    md = result.metadata
    if not result.written:
        return EnsembleChange(md, not_open=result.reason)
    new_ens = md.current_ensemble
    replaced = set(failed) | {i for i, b in enumerate(new_ens) if b != ensemble[i]}
    clients: dict[int, BookieClient | None] = {}
    for i in replaced:
        try:
            clients[i] = await bk.client(new_ens[i])
        except Exception as e:
            clients[i] = None
            log.warning("ledger %d: replacement bookie %s unreachable: %s", md.ledger_id, new_ens[i], e,
                        extra={"ledger_id": md.ledger_id, "bookie": new_ens[i]})
    log.info("ledger %d: ensemble change at entry %d: %s -> %s", md.ledger_id, md.fragments[-1].first_entry_id,
             [ensemble[i] for i in sorted(replaced)], [new_ens[i] for i in sorted(replaced)],
             extra={"ledger_id": md.ledger_id})
    return EnsembleChange(md, replaced=replaced, clients=clients)
