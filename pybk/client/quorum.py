"""Quorum arithmetic of the replication protocol (docs/protocol.md), pure and server-free.

Indices here are positions in a fragment's ensemble (0 .. E-1), never bookie ids; which indices
store an entry (its write set) is `pybk.ledger.write_set`.
"""
from __future__ import annotations

import enum
from collections import deque
from typing import Iterable, Sequence

from pybk.ledger import write_set


def validate(ensemble: int, write_quorum: int, ack_quorum: int) -> None:
    """Raise ValueError unless E >= Qw >= Qa >= 1."""
    if not (ensemble >= write_quorum >= ack_quorum >= 1):
        raise ValueError(f"need ensemble >= write_quorum >= ack_quorum >= 1, "
                         f"got E={ensemble} Qw={write_quorum} Qa={ack_quorum}")


def write_quorums(ensemble: int, write_quorum: int) -> list[list[int]]:
    """The E distinct write quorums of an ensemble (one per starting index)."""
    return [write_set(i, ensemble, write_quorum) for i in range(ensemble)]


def first_copies(ws: Sequence[int], ack_quorum: int, busy: Sequence[bool]) -> tuple[list[int], list[int]]:
    """A lone add's write set split into the Qa indices sent at once and the rest (held): the
    idle bookies first (`busy[i]`: index i has a batch in flight, which an add to it would
    wait behind), else in write-set order. Any Qa copies of the write set ack the entry."""
    order = sorted(ws, key=busy.__getitem__)   # stable: write-set order among equals
    return order[:ack_quorum], order[ack_quorum:]


def fencing_complete(ensemble: int, write_quorum: int, ack_quorum: int, answered: Iterable[int]) -> bool:
    """True once every write quorum has at least Qw - Qa + 1 answering bookies.

    Then no write quorum has Qa bookies left that could accept a normal add from the old
    writer, so it can no longer get anything acked."""
    got = set(answered)
    need = write_quorum - ack_quorum + 1
    return all(sum(1 for i in q if i in got) >= need for q in write_quorums(ensemble, write_quorum))


class ReplicaAnswer(enum.Enum):
    """What one replica said to a recovery read of one entry."""

    FOUND = "found"        # returned the entry with a valid digest
    MISSING = "missing"    # NO_ENTRY or NO_LEDGER: this bookie does not hold it
    ERROR = "error"        # unreachable, I/O error, corrupt body: says nothing either way


class RecoveryDecision(enum.Enum):
    EXISTS = "exists"          # some replica has it: recover (re-write) it
    MISSING = "missing"        # Qw - Qa + 1 replicas lack it: it was never acked; stop here
    UNDECIDED = "undecided"    # wait for more answers
    FAILED = "failed"          # everyone answered and neither holds: cannot decide safely


def recovery_read_decision(write_quorum: int, ack_quorum: int,
                           answers: Sequence[ReplicaAnswer]) -> RecoveryDecision:
    """Decide a recovery read of one entry from the answers of its write quorum so far.

    The entry exists if any replica returns it. It may be declared non-existent only when
    Qw - Qa + 1 replicas lack it: an acked entry is on at least Qa of the Qw, so at most
    Qw - Qa of them can lack it."""
    if ReplicaAnswer.FOUND in answers:
        return RecoveryDecision.EXISTS
    if sum(1 for a in answers if a is ReplicaAnswer.MISSING) >= write_quorum - ack_quorum + 1:
        return RecoveryDecision.MISSING
    if len(answers) >= write_quorum:
        return RecoveryDecision.FAILED
    return RecoveryDecision.UNDECIDED


class AckTracker:
    """Acks of the entries in flight, and the ordered advance of the LAC.

    Entry e is acked to the application once Qa bookies of its write set acked it and
    every entry before it is acked; the LAC is the last such entry."""

    def __init__(self, ensemble: int, write_quorum: int, ack_quorum: int, lac: int = -1):
        validate(ensemble, write_quorum, ack_quorum)
        self.ensemble = ensemble
        self.write_quorum = write_quorum
        self.ack_quorum = ack_quorum
        self.lac = lac
        self._acks: deque[set[int]] = deque()

    @property
    def next_entry(self) -> int:
        """The id the next added entry gets."""
        return self.lac + 1 + len(self._acks)

    @property
    def pending(self) -> range:
        """Ids of entries sent but not yet acked to the application."""
        return range(self.lac + 1, self.next_entry)

    def add(self) -> int:
        """Start tracking the next entry; returns its id."""
        self._acks.append(set())
        return self.next_entry - 1

    def acks(self, entry_id: int) -> set[int]:
        """Indices that acked a pending entry (a copy)."""
        return set(self._acks[entry_id - self.lac - 1])

    def ack(self, entry_id: int, index: int) -> int:
        """Record that ensemble index `index` stored `entry_id`; returns the (new) LAC.

        Acks for entries already acked, or from indices outside the entry's write set, are ignored."""
        lac = self.lac
        acks = self._acks
        pos = entry_id - lac - 1
        # the last test is pybk.ledger.holds, inlined: this runs for every ack
        if pos < 0 or pos >= len(acks) or (index - entry_id) % self.ensemble >= self.write_quorum:
            return lac
        acks[pos].add(index)
        return self._advance() if pos == 0 else lac

    def ack_many(self, entry_ids: Iterable[int], index: int) -> int:
        """ack(e, index) for every e of entry_ids, in one step; returns the (new) LAC.

        Proof that it ends in the state the acks one by one would: an ack adds `index` to the ack
        set of a pending entry and never removes one, so the sets are the same after both (acks
        for entries acked before the call, beyond the pending ones or outside the write set are
        ignored by both; acks for entries acked during the calls one by one only grow sets that
        are dropped anyway). The LAC then advances over the longest prefix of pending entries
        with Qa acks each, whether it advanced in steps or at once, because sets only grow."""
        lac = self.lac
        acks = self._acks
        n = len(acks)
        e, qw = self.ensemble, self.write_quorum
        base = lac + 1
        for entry_id in entry_ids:
            pos = entry_id - base
            if 0 <= pos < n and (index - entry_id) % e < qw:
                acks[pos].add(index)
        return self._advance()

    def _advance(self) -> int:
        """Move the LAC over the leading pending entries that have Qa acks; returns it."""
        acks, qa, lac = self._acks, self.ack_quorum, self.lac
        while acks and len(acks[0]) >= qa:
            acks.popleft()
            lac += 1
        self.lac = lac
        return lac

    def forget(self, indices: Iterable[int]) -> None:
        """Drop acks from replaced ensemble indices (an ensemble change rewrites them elsewhere)."""
        gone = set(indices)
        for s in self._acks:
            s -= gone
