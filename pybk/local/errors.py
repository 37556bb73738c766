"""What goes wrong on the local platform, as errors whose message says why."""
from __future__ import annotations


class LocalClusterError(RuntimeError):
    """The local cluster could not be started, changed or stopped; the message says why."""


class ChangeRefused(LocalClusterError):
    """A change that would be unsafe was refused before anything was done."""


class ReconcileInterrupted(LocalClusterError):
    """A newer manifest (or a stop) arrived before the change finished."""
