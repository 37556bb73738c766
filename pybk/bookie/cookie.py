"""Cookies: which bookie, cluster and directories a journal/ledger dir belongs to.

Written to every directory (and to the metadata store) at first start; a mismatch on a later start
means dirs were swapped, wiped or shared, and the bookie refuses to run rather than serve wrong data.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

COOKIE_FILE = "COOKIE"


class CookieMismatchError(Exception):
    """The directories do not belong to this bookie; the message says what differs and what to do."""


@dataclass
class Cookie:
    instance_id: str
    bookie_id: str
    journal_dir: str
    ledger_dirs: list[str] = field(default_factory=list)

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> "Cookie":
        d = json.loads(data)
        return cls(d.get("instance_id", ""), d["bookie_id"], d["journal_dir"], list(d.get("ledger_dirs", [])))

    @classmethod
    def for_dirs(cls, instance_id: str, bookie_id: str, journal_dir: Path, ledger_dirs: list[Path]) -> "Cookie":
        return cls(instance_id, bookie_id, str(Path(journal_dir).resolve()),
                   [str(Path(d).resolve()) for d in ledger_dirs])

    def differences(self, other: "Cookie") -> list[str]:
        """Human-readable fields that differ between a stored cookie (self) and the expected one."""
        out = []
        if self.instance_id and other.instance_id and self.instance_id != other.instance_id:
            out.append(f"cluster instance id: stored {self.instance_id!r}, this cluster is {other.instance_id!r}")
        if self.bookie_id != other.bookie_id:
            out.append(f"bookie id: stored {self.bookie_id!r}, this bookie is {other.bookie_id!r}")
        if self.journal_dir != other.journal_dir:
            out.append(f"journal dir: stored {self.journal_dir!r}, now {other.journal_dir!r}")
        if sorted(self.ledger_dirs) != sorted(other.ledger_dirs):
            out.append(f"ledger dirs: stored {self.ledger_dirs}, now {other.ledger_dirs}")
        return out


def _fix_hint(stored: Cookie) -> str:
    return (f"To fix: start the bookie that owns these dirs with --bookie-id {stored.bookie_id} "
            f"--journal-dir {stored.journal_dir} " + " ".join(f"--ledger-dir {d}" for d in stored.ledger_dirs)
            + "; or give this bookie empty dirs of its own; to reuse the dirs for a new bookie, decommission "
              f"{stored.bookie_id} first, then empty the dirs and delete its cookie from the metadata store.")


def read_local(directory: Path) -> Cookie | None:
    try:
        return Cookie.from_bytes((Path(directory) / COOKIE_FILE).read_bytes())
    except FileNotFoundError:
        return None
    except (ValueError, KeyError) as exc:
        raise CookieMismatchError(f"the cookie file {Path(directory) / COOKIE_FILE} is unreadable ({exc}); "
                                  f"restore it or empty the directory") from exc


def write_local(directory: Path, cookie: Cookie) -> None:
    path = Path(directory) / COOKIE_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(cookie.to_bytes())
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def check(expected: Cookie, dirs: list[Path], registered: Cookie | None = None) -> bool:
    """Verify the cookies of dirs (and the one in the metadata store, when known) against `expected`.

    Returns True when this is a fresh bookie (no cookie anywhere): the caller then writes them.
    Raises CookieMismatchError naming what differs and how to fix it.
    """
    found = {Path(d): read_local(d) for d in dirs}
    present = {d: c for d, c in found.items() if c is not None}
    if not present:
        if registered is not None:
            raise CookieMismatchError(
                f"bookie {expected.bookie_id} has a cookie in the metadata store but its dirs "
                f"{[str(d) for d in dirs]} have none: they were wiped or replaced, and the data this bookie "
                f"held is gone. If that is intended, delete the bookie's cookie from the metadata store "
                f"(after autorecovery re-replicated its ledgers) and start again.")
        return True
    for d, c in present.items():
        diff = c.differences(expected)
        if diff:
            raise CookieMismatchError(
                f"cookie mismatch in {d}: it belongs to bookie {c.bookie_id} — " + "; ".join(diff) + ". "
                + _fix_hint(c))
    missing = [str(d) for d, c in found.items() if c is None]
    if missing:
        raise CookieMismatchError(
            f"dirs {missing} have no cookie while {[str(d) for d in present]} do: a directory was added or "
            f"wiped. Restore the missing data, or start with the dirs listed in the cookie "
            f"({next(iter(present.values())).ledger_dirs}).")
    if registered is not None:
        diff = registered.differences(expected)
        if diff:
            raise CookieMismatchError(
                f"the cookie of {expected.bookie_id} in the metadata store differs from the local dirs — "
                + "; ".join(diff) + ". " + _fix_hint(registered))
    return False
