"""Who a caller is and what it may do: the pure rules of authorization.

Roles are ordered, each includes the ones below it: `reader` < `writer` < `admin`. Every
operation a bookie or an admin endpoint offers needs one role (`REQUIRED`); the master key of a
ledger is checked on top of the role, by the bookie, for adds, fences and LAC writes. With
authentication off every caller is `OPEN`, an admin, and the bookie says so loudly at start.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["Operation", "OPEN", "Principal", "REQUIRED", "Role", "allowed"]


class Role(enum.IntEnum):
    """What a caller may do; a higher role includes every lower one."""

    READER = 1
    WRITER = 2
    ADMIN = 3

    @classmethod
    def parse(cls, text: str) -> "Role":
        """`reader`, `writer` or `admin` (any case); ValueError naming the choices otherwise."""
        try:
            return cls[text.strip().upper()]
        except KeyError:
            raise ValueError(f"unknown role {text!r}; choose reader, writer or admin") from None

    def __str__(self) -> str:
        return self.name.lower()


@dataclass(frozen=True)
class Principal:
    """An authenticated caller: a name for logs and answers, and its role."""

    name: str
    role: Role

    def may(self, operation: "Operation") -> bool:
        """Whether this caller's role allows `operation`."""
        return allowed(self.role, operation)


OPEN = Principal("anonymous (security off)", Role.ADMIN)


class Operation(enum.Enum):
    """Everything a caller can ask of a bookie or an admin endpoint."""

    READ = "read"                  # Read (no fence), ReadLac, long-poll
    LIST = "list"                  # ListEntries, ListLedgers
    INFO = "info"                  # Info, GET admin endpoints
    ADD = "add"                    # Add, with the ledger's master key
    FENCE = "fence"                # Read with FENCE, with the ledger's master key
    WRITE_LAC = "write_lac"        # WriteLac, with the ledger's master key
    KEYLESS_RECOVERY = "keyless_recovery"  # fence or recovery add without the master key
    ADMINISTER = "administer"      # state-changing admin endpoints, delete --force


REQUIRED: dict[Operation, Role] = {
    Operation.READ: Role.READER,
    Operation.LIST: Role.READER,
    Operation.INFO: Role.READER,
    Operation.ADD: Role.WRITER,
    Operation.FENCE: Role.WRITER,
    Operation.WRITE_LAC: Role.WRITER,
    Operation.KEYLESS_RECOVERY: Role.ADMIN,
    Operation.ADMINISTER: Role.ADMIN,
}


def allowed(role: Role, operation: Operation) -> bool:
    """Whether `role` may perform `operation` (roles include the lower ones)."""
    return role >= REQUIRED[operation]
