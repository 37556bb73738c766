"""Autorecovery settings shared by the auditor, the replication worker and decommission."""
from __future__ import annotations

import dataclasses

from pybk import entry
from pybk.config import option_field


@dataclasses.dataclass(frozen=True)
class RecoveryOptions:
    """Knobs of autorecovery (the autorecovery options of the table, which holds their defaults).
    Tests shorten the delays; production keeps the defaults."""

    lost_bookie_delay: float = option_field("lost_bookie_delay")  # a bookie gone this long is lost
    audit_interval: float = option_field("audit_interval")        # periodic full check; 0 = off
    open_ledger_grace: float = option_field("open_ledger_grace")  # before fencing an open ledger's writer
    poll_interval: float = option_field("poll_interval")          # how often idle loops look again
    batch_entries: int = option_field("replication_batch")        # entries per copy run (one read_range)
    parallel_runs: int = option_field("parallel_runs")            # copy runs in flight per fragment
    parallel_ledgers: int = option_field("parallel_ledgers")      # ledgers one worker replicates at once
    ledger_password: tuple[str, ...] | None = option_field("ledger_password")  # passwords it may use (matched by hash)
    job_gc_interval: float = option_field("job_gc_interval")      # settle write jobs' leftovers; 0 = off
    job_gc_grace: float = option_field("job_gc_grace")            # an undecided job is aborted this long after
    max_inflight_bytes: int = 4 << 20  # unanswered recovery-add bytes per run (bounds memory; no option)

    @property
    def passwords(self) -> tuple[bytes, ...]:
        """The passwords tried: the empty one first, then the configured ones."""
        return tuple(dict.fromkeys([b"", *(p.encode() for p in self.ledger_password or ())]))

    def password_for(self, password_hash: bytes) -> bytes | None:
        """The configured password whose hash the metadata stores, or None. Autorecovery copies
        and fences keyless (its admin role) either way; the password only lets it verify MAC
        digests fully (without, they are checked structurally, as in BookKeeper >= 4.6)."""
        for pw in self.passwords:
            if entry.password_hash(pw) == password_hash:
                return pw
        return None
