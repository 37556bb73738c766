"""The add path's decisions, as one pure function: runs of entries and the ledgers' states in;
the entries accepted, the per-entry refusals and the state changes out (`decide`). The bookie
applies a decision in one thin I/O step (journal records, write cache, ledger states), the way
etcd's raft hands a `Ready` to its application.

Every entry is checked alone (size, header, LAC); the key and fencing are decided once per run.
Entries are write-once: an id already held is accepted again only with the same bytes.
"""
from __future__ import annotations

from typing import Callable, Mapping, NamedTuple, Sequence

from pybk.entry import HEADER, HEADER_SIZE
from pybk.proto import pb

from .state import KEY_MISSING, LedgerState

Admission = Callable[[int, bytes], tuple[int, str]]  # (ledger, first key) -> (status, why not)
Refusal = tuple[int, int, str]  # (entry index in the batch, status, message)

_OK = pb.OK
_BAD = pb.BAD_REQUEST


class AddRun(NamedTuple):
    """Entries of one ledger with one master key and flags, as the add path takes them: a packed
    run of the wire (pb.AddRun) or consecutive AddEntry messages alike. `packed` is the bodies
    back to back, when the wire brought them so (a run wholly accepted is journaled from it)."""

    ledger_id: int
    master_key: bytes
    flags: int
    entry_ids: Sequence[int]
    bodies: Sequence[bytes]
    packed: bytes | None = None


def runs_of(entries) -> list[AddRun]:
    """pb.AddEntry messages grouped into runs of consecutive entries with the same ledger, key
    and flags (the order kept, so an entry's index is the same in both)."""
    runs: list[AddRun] = []
    ids: list[int] = []
    bodies: list[bytes] = []
    last = None
    for e in entries:
        k = (e.ledger_id, e.master_key, e.flags)
        if k != last:
            ids, bodies, last = [], [], k
            runs.append(AddRun(*k, ids, bodies))
        ids.append(e.entry_id)
        bodies.append(e.body)
    return runs


def count(runs: Sequence[AddRun]) -> int:
    """The entries of the runs."""
    return sum(len(r.entry_ids) for r in runs)


class Write(NamedTuple):
    """What to write for one run: its first key to record (None: none; b"": the ledger is new to
    this bookie and keyless), then its accepted entries (`packed` when the run is whole)."""

    ledger_id: int
    new_key: bytes | None
    entry_ids: Sequence[int]
    bodies: Sequence[bytes]
    packed: bytes | None


class Decision(NamedTuple):
    """A batch decided: refusals in ascending index order (every other entry is accepted), the
    writes in order, and the LAC each ledger's accepted entries carry at the most."""

    errors: list[Refusal]
    writes: list[Write]
    lacs: dict[int, int]


def decide(runs: Sequence[AddRun], ledgers: Mapping[int, LedgerState], *, max_entry_size: int,
           held_last: Callable[[int], int], existing: Callable[[int, int], bytes | memoryview | None],
           keyless: bool = False, admit: Admission | None = None) -> Decision:
    """Decide a batch of runs against the ledgers' states, changing nothing.

    `held_last(ledger)` is the highest entry id the bookie may hold (-1: none), `existing(ledger,
    entry)` the body it holds (None: none, or none readable): only an id at or below the first is
    looked up with the second, so new ids cost one comparison each. `keyless`: the caller may do
    keyless recovery, so recovery adds with an empty key are accepted (and record no key).
    `admit(ledger, key)` decides a key the bookie would record first (state.needs_admission):
    (OK, "") to accept, a refusal, or (LOOKUP, "") when the metadata must be read first; None
    accepts every first key (a bookie without metadata)."""
    errors: list[Refusal] = []
    writes: list[Write] = []
    lacs: dict[int, int] = {}
    keys: dict[int, bytes] = {}  # first keys decided in this batch (b"": made keyless)
    batch: dict[int, dict[int, bytes]] = {}  # entries accepted by earlier runs of this batch
    unpack = HEADER.unpack_from
    last_ledger = -1
    cur_key = b""
    cur_recovery_only = False  # fenced, or a keyless run: only recovery adds pass
    i = -1
    for r in runs:
        ledger, key, recovery = r.ledger_id, r.master_key, r.flags & 1
        decided = False
        refusal = None
        new_key = None
        refused = len(errors)
        high = -1            # ids above it are new (held_last, then the run's accepted ids)
        earlier: dict = {}   # the run's accepted entries before index `seen`, filled on the rare path
        start = seen = i + 1
        held = batch.get(ledger, {})
        for eid, body in zip(r.entry_ids, r.bodies):
            i += 1
            size = len(body)
            if size < HEADER_SIZE or size > max_entry_size:
                errors.append((i, _BAD, f"entry body of {size} bytes: must be {HEADER_SIZE}..{max_entry_size} bytes"))
                continue
            hl, he, hlac, _ = unpack(body)
            if hl != ledger or he != eid or eid < 0:
                errors.append((i, _BAD, f"request says entry {ledger}:{eid}, body header says {hl}:{he}"))
                continue
            if hlac >= eid:
                errors.append((i, _BAD, f"entry {ledger}:{eid} carries LAC {hlac}: a LAC must be below its entry id"))
                continue
            if not decided:  # the run's key, once, at its first well-formed entry
                decided = True
                if ledger != last_ledger or key != cur_key:
                    st = ledgers.get(ledger)
                    known = keys[ledger] if ledger in keys else (st.master_key if st is not None else None)
                    if known is None or known != key:
                        refusal, new_key = _run_key(ledger, key, known, keyless, admit)
                        if refusal is not None:
                            last_ledger = -1
                        elif new_key is not None:
                            keys[ledger] = new_key
                    if refusal is None:
                        last_ledger, cur_key = ledger, key
                        cur_recovery_only = (st is not None and st.fenced) or not key
                if refusal is None:
                    high = max(held_last(ledger), max(held, default=-1))
            if refusal is not None:
                errors.append((i, *refusal))
                continue
            if cur_recovery_only and not recovery:
                errors.append((i, pb.FENCED, f"ledger {ledger} is fenced") if cur_key else (i, _BAD, KEY_MISSING))
                continue
            if eid > high:
                high = eid
            else:  # an id this bookie, or this batch, may hold already: the rare path
                _catch_up(earlier, r, start, seen, i, errors, refused)
                seen = i + 1
                stored = held.get(eid)
                if stored is None:
                    stored = existing(ledger, eid)
                if stored is None:
                    stored = earlier.get(eid)
                if stored is not None and stored != body:
                    errors.append((i, pb.ENTRY_EXISTS, f"entry {ledger}:{eid} is stored here with other bytes: "
                                                        f"entries are write-once, the stored one stays"))
                    continue
                earlier[eid] = body
            if hlac > lacs.get(ledger, -1):
                lacs[ledger] = hlac
        ids, bodies, packed = r.entry_ids, r.bodies, r.packed
        if len(errors) > refused:  # some of the run refused: write the rest
            first = i + 1 - len(ids)
            out = {k - first for k, _, _ in errors[refused:]}
            keep = [k for k in range(len(ids)) if k not in out]
            ids, bodies, packed = [ids[k] for k in keep], [bodies[k] for k in keep], None
        if ids or new_key is not None:
            writes.append(Write(ledger, new_key, ids, bodies, packed))
        if ids:
            batch.setdefault(ledger, {}).update(zip(ids, bodies))
    return Decision(errors, writes, lacs)


def _run_key(ledger: int, key: bytes, known: bytes | None, keyless: bool, admit: Admission | None
             ) -> tuple[tuple[int, str] | None, bytes | None]:
    """The key decision for a run whose key is not the one recorded for its ledger (`known`,
    None when the bookie has no state for it): (None, the first key to record or None) to accept
    the run, or ((status, message), None) to refuse it."""
    if not key:
        if not keyless:
            return (_BAD, KEY_MISSING), None
        return None, (b"" if known is None else None)
    if known:
        return (pb.UNAUTHORIZED, f"wrong master key for ledger {ledger}"), None
    if admit is not None:
        status, why = admit(ledger, key)
        if status != _OK:
            return (status, why), None
    return None, key


def _catch_up(earlier: dict, run: AddRun, start: int, seen: int, i: int, errors: list[Refusal],
              refused: int) -> None:
    """Add to `earlier` (entry id -> body) the entries of `run`, whose first has batch index
    `start`, from index `seen` up to `i` (excluded) that were not refused: what a later entry of
    the run may repeat. The run's refusals are errors[refused:], in index order, so those at or
    after `seen` are their tail."""
    out = set()
    k = len(errors) - 1
    while k >= refused and errors[k][0] >= seen:
        out.add(errors[k][0])
        k -= 1
    ids, bodies = run.entry_ids, run.bodies
    for j in range(seen, i):
        if j not in out:
            earlier[ids[j - start]] = bodies[j - start]
