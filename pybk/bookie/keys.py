"""The bookie's check of first keys against the ledger metadata (state.admit_new_key), with a
cache of what the metadata says, so that the add path stays synchronous: `admit` answers from
the cache or says LOOKUP, and the service calls `lookup` before adding those entries again.

Only ledgers that exist are cached (a ledger id refused now may be created later); their key
checks never change, so cached entries need no invalidation.
"""
from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from typing import Iterable

from pybk.meta.errors import MetadataError, NoSuchLedgerError
from pybk.meta.ledgers import MAX_LEDGER_ID, Ledgers
from pybk.proto import pb

from .adds import Admission
from .state import LOOKUP, LedgerKeys, admit_new_key

log = logging.getLogger("pybk.bookie.keys")

CACHE_LEDGERS = 10_000
LOOKUP_TIMEOUT = 10.0


class KeyGate:
    """First-key admission for one bookie, reading `ledgers` (the metadata store)."""

    def __init__(self, ledgers: Ledgers, capacity: int = CACHE_LEDGERS):
        self.ledgers = ledgers
        self.capacity = capacity
        self._known: OrderedDict[int, LedgerKeys] = OrderedDict()

    def admit(self, ledger: int, key: bytes) -> tuple[int, str]:
        """From the cache: (OK, ""), a refusal, or (LOOKUP, "") when the metadata must be read."""
        keys = self._known.get(ledger)
        if keys is None:
            return LOOKUP, ""
        return admit_new_key(ledger, key, keys)

    def admit_from(self, found: dict[int, tuple[int, str] | LedgerKeys | None]) -> Admission:
        """An admission deciding by what `lookup` found (ledgers it could not read are refused)."""
        def admit(ledger: int, key: bytes) -> tuple[int, str]:
            keys = found.get(ledger) if ledger in found else self._known.get(ledger)
            if isinstance(keys, tuple):
                return keys
            return admit_new_key(ledger, key, keys)
        return admit

    async def lookup(self, ledger_ids: Iterable[int]) -> dict[int, tuple[int, str] | LedgerKeys | None]:
        """What the metadata says of each ledger: its LedgerKeys, None if it does not exist, or
        (IO_ERROR, why) when the metadata could not be read."""
        ids = list(dict.fromkeys(ledger_ids))
        answers = await asyncio.gather(*(self._read(i) for i in ids))
        return dict(zip(ids, answers))

    async def check(self, ledger: int, key: bytes) -> tuple[int, str]:
        """(status, why not) for a first key of a fence or WriteLac."""
        status, why = self.admit(ledger, key)
        if status != LOOKUP:
            return status, why
        return self.admit_from(await self.lookup([ledger]))(ledger, key)

    async def _read(self, ledger: int) -> tuple[int, str] | LedgerKeys | None:
        if not 0 < ledger <= MAX_LEDGER_ID:
            return None  # no ledger can have this id
        try:
            async with asyncio.timeout(LOOKUP_TIMEOUT):
                md = await self.ledgers.get(ledger)
        except NoSuchLedgerError:
            return None
        except (MetadataError, OSError, TimeoutError) as exc:
            log.warning("cannot read ledger %d's metadata to check a key: %s", ledger, exc, extra={"ledger_id": ledger})
            return pb.IO_ERROR, f"cannot check the key of ledger {ledger} against the metadata: {exc}"
        keys = LedgerKeys(key_check=md.key_check, master_key=md.master_key)
        self._known[ledger] = keys
        while len(self._known) > self.capacity:
            self._known.popitem(last=False)
        return keys
