"""AutoRecovery (auditor and replication worker) and decommission.

- plan.py: the pure decisions (what is missing where, copy runs, open-ledger grace, drain
  progress), tested without servers, on the geometry of `pybk.ledger`; replacement bookies are
  placed by the client's rule (`pybk.client.placement.replace_bookies`).
- auditor.py: the elected auditor: lost bookies (gone > lost-bookie delay) and the periodic
  ListEntries check mark ledgers under-replicated; reports zone-spreading violations.
- worker.py: replication workers: lock a marker, copy entries with recovery adds, CAS the fragment.
- decommission.py: read-only + drain request + markers; the auditor finishes drains.
- service.py: one process = auditor candidate + worker (`pybk autorecovery`, main.py), or embedded
  in a bookie (`pybk bookie --autorecovery`, embedded.py).
- http.py / admin.py / shell.py: `/api/v1/autorecovery/*`, the functions behind them, and the
  `pybk shell` commands listunderreplicated, whoisauditor, triggeraudit, decommission, recover.
- process.py: `AutoRecoveryProcess`, a real `pybk autorecovery` child process.

Ledger metadata holds no master key (only one-way hashes: docs/security.md), so autorecovery
re-replicates and fences ledgers without their keys: its copies and fences are keyless, which
bookies accept only from a caller with the `admin` role (its own credential; every caller when
security is off). A configured password (`--ledger-password`, `PYBK_LEDGER_PASSWORDS`; the empty
password is always tried) is still used when its hash matches the metadata's: then MAC digests
are verified while copying (without it only their length and ids are checked).
"""
