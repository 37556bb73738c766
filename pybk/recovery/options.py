"""Autorecovery settings shared by the auditor, the replication worker and decommission."""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from pybk import entry
from pybk.spark.commit import DEFAULT_GRACE_S


@dataclasses.dataclass
class RecoveryOptions:
    """Knobs of autorecovery. Tests shorten the delays; production keeps the defaults."""

    lost_bookie_delay: float = 60.0    # a bookie gone this long is lost: mark its ledgers
    audit_interval: float = 3600.0     # periodic full check (ListEntries of every ledger); 0 = off
    open_ledger_grace: float = 30.0    # wait this long before fencing an open ledger's writer
    poll_interval: float = 1.0         # how often idle loops look again (watches wake them earlier)
    batch_entries: int = 4096          # entries per copy run (one read_range from one source)
    max_inflight_bytes: int = 4 << 20  # unanswered recovery-add bytes per run (bounds memory)
    parallel_runs: int = 4             # copy runs in flight per fragment
    parallel_ledgers: int = 4          # ledgers one worker replicates at once
    passwords: tuple[bytes, ...] = (b"",)  # ledger passwords autorecovery may use (matched by hash)
    job_gc_interval: float = 600.0     # settle write jobs' leftovers (pybk.spark.gc) this often; 0 = off
    job_gc_grace: float = DEFAULT_GRACE_S  # an undecided write job is aborted this long after its ledger's creation

    def password_for(self, password_hash: bytes) -> bytes | None:
        """The configured password whose hash the metadata stores, or None. Autorecovery copies
        and fences keyless (its admin role) either way; the password only lets it verify MAC
        digests fully (without, they are checked structurally, as in BookKeeper >= 4.6)."""
        for pw in self.passwords:
            if entry.password_hash(pw) == password_hash:
                return pw
        return None


def from_config(cfg: Mapping[str, Any]) -> RecoveryOptions:
    """The options of resolved autorecovery settings (`pybk.config.RECOVERY_TUNING`, in
    `pybk autorecovery` and in `pybk bookie --autorecovery`)."""
    passwords = [b""] + [p.encode() for p in cfg["ledger_password"] or ()]
    return RecoveryOptions(
        lost_bookie_delay=cfg["lost_bookie_delay"], audit_interval=cfg["audit_interval"],
        open_ledger_grace=cfg["open_ledger_grace"], poll_interval=cfg["poll_interval"],
        batch_entries=cfg["replication_batch"], parallel_ledgers=cfg["parallel_ledgers"],
        parallel_runs=cfg["parallel_runs"], passwords=tuple(dict.fromkeys(passwords)),
        job_gc_interval=cfg["job_gc_interval"], job_gc_grace=cfg["job_gc_grace"])
