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

Ledger metadata stores the master key bookies check on adds and fences (derived from the
password; never the password itself), as BookKeeper >= 4.6 keeps ledger credentials in metadata,
so autorecovery re-replicates and fences ledgers without knowing their passwords. A configured
password (`--ledger-password`, `PYBK_LEDGER_PASSWORDS`; the empty password is always tried) is
still used when its hash matches the metadata's: then MAC digests are verified while copying
(without it only their length and ids are checked), and it is the only way to repair ledgers
created before the key was stored.
"""
