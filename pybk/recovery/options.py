"""Autorecovery settings shared by the auditor, the replication worker and decommission."""
from __future__ import annotations

import dataclasses
import os

from pybk import entry


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

    def master_key_for(self, password_hash: bytes, stored_key: bytes = b"") -> tuple[bytes | None, bytes] | None:
        """(password, master key) to re-replicate and fence a ledger with, or None if there is none.

        A configured password whose hash the metadata stores wins (MAC digests are then fully
        verified); else the master key the metadata stores (`stored_key`; ledgers created
        before it was stored have none), with password None: MAC digests can then be checked
        only structurally, as in BookKeeper >= 4.6, whose metadata keeps the ledger's key."""
        for pw in self.passwords:
            if entry.password_hash(pw) == password_hash:
                return pw, entry.master_key(pw)
        return (None, stored_key) if stored_key else None


def from_env(environ: dict[str, str] | None = None) -> RecoveryOptions:
    """Options from PYBK_* environment variables (for autorecovery embedded in a bookie):
    PYBK_LOST_BOOKIE_DELAY, PYBK_AUDIT_INTERVAL, PYBK_OPEN_LEDGER_GRACE, PYBK_RECOVERY_POLL_INTERVAL,
    PYBK_REPLICATION_BATCH, PYBK_LEDGER_PASSWORDS (comma-separated)."""
    env = os.environ if environ is None else environ
    d = RecoveryOptions()
    passwords = [b""] + [p.encode() for p in env.get("PYBK_LEDGER_PASSWORDS", "").split(",") if p]
    return RecoveryOptions(
        lost_bookie_delay=float(env.get("PYBK_LOST_BOOKIE_DELAY", d.lost_bookie_delay)),
        audit_interval=float(env.get("PYBK_AUDIT_INTERVAL", d.audit_interval)),
        open_ledger_grace=float(env.get("PYBK_OPEN_LEDGER_GRACE", d.open_ledger_grace)),
        poll_interval=float(env.get("PYBK_RECOVERY_POLL_INTERVAL", d.poll_interval)),
        batch_entries=int(env.get("PYBK_REPLICATION_BATCH", d.batch_entries)),
        passwords=tuple(dict.fromkeys(passwords)))
