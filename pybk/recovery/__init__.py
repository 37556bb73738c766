"""Autorecovery's library (auditor, replication worker, decommission) and its admin calls.

- plan.py: the pure decisions (what is missing where, copy runs, open-ledger grace, drain
  progress), tested without servers, on the geometry of `pybk.ledger`; replacement bookies are
  placed by the client's rule (`pybk.client.placement.replace_bookies`).
- auditor.py: the elected auditor: lost bookies (gone > lost-bookie delay) and the periodic
  ListEntries check mark ledgers under-replicated; reports zone-spreading violations.
- worker.py: replication workers: lock a marker, copy entries with recovery adds, CAS the fragment.
- decommission.py: read-only + drain request + markers; the auditor finishes drains.
- admin.py: the functions behind `/api/v1/autorecovery/*` and the `pybk shell` commands
  (pybk.shell.recovery) listunderreplicated, whoisauditor, triggeraudit, decommission, recover.

This package is the library; the process that runs it (`pybk autorecovery`, or embedded in a
bookie) is `pybk.autorecovery`, and `pybk.local.autorecovery` starts one as a child process.

Ledger metadata holds no master key (only one-way hashes: docs/security.md), so autorecovery
re-replicates and fences ledgers without their keys: its copies and fences are keyless, which
bookies accept only from a caller with the `admin` role (its own credential; every caller when
security is off). A configured password (`--ledger-password`, `PYBK_LEDGER_PASSWORDS`; the empty
password is always tried) is still used when its hash matches the metadata's: then MAC digests
are verified while copying (without it only their length and ids are checked).
"""
