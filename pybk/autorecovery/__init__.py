"""The autorecovery process: an auditor candidate and a replication worker over the recovery
library (`pybk.recovery`).

- service.py: `AutoRecovery`, one auditor candidate + worker, as `pybk autorecovery` (main.py)
  runs it or a bookie embeds it (`pybk bookie --autorecovery`, embedded.py).
- http.py: the `/api/v1/autorecovery/*` routes, mounted by both.
"""
