"""The typed steps the BookieLog controller asks a platform to take; each is idempotent."""
from __future__ import annotations

from dataclasses import dataclass

from pybk.cluster.actions import SetCondition
from pybk.log import LogConfig

__all__ = ["AdoptLog", "CreateLog", "DeleteLog", "ReconfigureLog", "SetCondition", "TruncateLog", "Action"]


@dataclass(frozen=True)
class CreateLog:
    """Create the log with this configuration and the Secret's password."""
    config: LogConfig


@dataclass(frozen=True)
class AdoptLog:
    """Record an existing log (created outside, or by an operator that died before recording it)
    as this resource's: its id goes into the status, and from then on the spec is applied to it."""
    log_id: int


@dataclass(frozen=True)
class ReconfigureLog:
    """Store the spec's configuration; `changes` name what differs (for the log and the status)."""
    config: LogConfig
    changes: tuple[str, ...]


@dataclass(frozen=True)
class TruncateLog:
    """Delete the closed segments below `before`, as the retention policy allows."""
    before: int


@dataclass(frozen=True)
class DeleteLog:
    """Delete the log and its data (deletionPolicy Delete). `force`: with the admin role instead of
    the password (the Secret is gone; the log was proven this resource's when it was adopted)."""
    log_id: int
    force: bool = False


Action = CreateLog | AdoptLog | ReconfigureLog | TruncateLog | DeleteLog | SetCondition
