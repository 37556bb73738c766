"""Bookie cookies: `{instance id, bookie id, journal dir, ledger dirs}` in etcd (`/<prefix>/cookies/<id>`,
no lease) and in each of the bookie's directories, and the start-up check that they agree.

A mismatch means the bookie would serve data that is not what the cluster thinks it holds
(wiped disks, swapped directories, another cluster's etcd); the bookie must refuse to start
and say what differs and how to fix it.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .errors import BadMetadataError, CookieMismatchError, VersionConflictError
from .etcd import Etcd, cmp_create, cmp_mod, op_delete, op_get, op_put, prefix_end
from .registry import check_bookie_id

COOKIE_FILE = "COOKIE"


@dataclass(frozen=True)
class Cookie:
    """A bookie's identity, tied to its cluster and directories."""

    instance_id: str
    bookie_id: str
    journal_dir: str
    ledger_dirs: tuple[str, ...]
    layout_version: int = 1
    version: int = field(default=0, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ledger_dirs", tuple(self.ledger_dirs))

    def to_bytes(self) -> bytes:
        d = asdict(self)
        d.pop("version")
        d["ledger_dirs"] = list(self.ledger_dirs)
        return json.dumps(d, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes, version: int = 0) -> "Cookie":
        try:
            d = json.loads(data)
            return cls(instance_id=str(d["instance_id"]), bookie_id=str(d["bookie_id"]),
                       journal_dir=str(d["journal_dir"]), ledger_dirs=tuple(map(str, d["ledger_dirs"])),
                       layout_version=int(d.get("layout_version", 1)), version=version)
        except (ValueError, KeyError, TypeError) as exc:
            raise BadMetadataError(f"undecodable cookie {data[:80]!r}: {exc!r}") from None

    def differences(self, other: "Cookie") -> list[str]:
        """Human descriptions of every field where other differs from self."""
        out = []
        for name in ("instance_id", "bookie_id", "journal_dir", "ledger_dirs", "layout_version"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine != theirs:
                out.append(f"{name}: expected {mine!r}, found {theirs!r}")
        return out

    @staticmethod
    def read_dir(directory: str | os.PathLike) -> "Cookie | None":
        """The cookie file of a bookie directory, or None if it has none."""
        path = Path(directory) / COOKIE_FILE
        try:
            return Cookie.from_bytes(path.read_bytes())
        except FileNotFoundError:
            return None

    def write_dir(self, directory: str | os.PathLike) -> None:
        """Write the cookie file into a bookie directory durably (temp file, fsync, rename)."""
        path = Path(directory) / COOKIE_FILE
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            f.write(self.to_bytes())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


NEW = "new"
OK = "ok"


def check(expected: Cookie, in_etcd: Cookie | None, in_dirs: dict[str, Cookie | None]) -> str:
    """The start-up decision: NEW (nothing anywhere: write the cookie everywhere), OK (all agree),
    else CookieMismatchError saying what differs and how to fix it."""
    bid = expected.bookie_id
    present = {d: c for d, c in in_dirs.items() if c is not None}
    missing = sorted(d for d, c in in_dirs.items() if c is None)
    if in_etcd is None and not present:
        return NEW
    problems: list[str] = []
    if in_etcd is None:
        problems.append(f"the directories {sorted(present)} hold a cookie but etcd has none for bookie {bid!r} "
                        "(wrong metadata URI or prefix? or the bookie was decommissioned: then wipe its "
                        "directories to start it as a new bookie)")
    else:
        diff = expected.differences(in_etcd)
        if diff:
            problems.append(f"etcd's cookie for bookie {bid!r} differs from this bookie's configuration: "
                            + "; ".join(diff) + " (restore the original configuration, or, if the bookie "
                            "really is new, decommission the old one / delete its cookie with "
                            f"`pybk shell decommission {bid}`)")
    for d, c in sorted(present.items()):
        diff = expected.differences(c)
        if diff:
            problems.append(f"the cookie in {d} differs: " + "; ".join(diff))
    if missing:
        problems.append(f"the directories {missing} have no cookie while the bookie has one elsewhere "
                        "(a directory was wiped or replaced: its data is gone; delete the bookie's cookie "
                        "and directories to rejoin as a new bookie and let autorecovery re-replicate)")
    if problems:
        raise CookieMismatchError(f"bookie {bid!r} refuses to start: " + " | ".join(problems))
    return OK


class Cookies:
    """`store.cookies`: cookies in etcd, CAS on every change."""

    def __init__(self, etcd: Etcd, prefix: bytes):
        self.etcd = etcd
        self.dir = prefix + b"cookies/"

    def key(self, bookie_id: str) -> bytes:
        return self.dir + check_bookie_id(bookie_id).encode()

    async def get(self, bookie_id: str) -> Cookie | None:
        kv = await self.etcd.get(self.key(bookie_id))
        return Cookie.from_bytes(kv.value, kv.mod_revision) if kv else None

    async def create(self, cookie: Cookie) -> Cookie:
        """Store a new cookie; VersionConflictError if the bookie has one already."""
        key = self.key(cookie.bookie_id)
        resp = await self.etcd.txn([cmp_create(key, 0)], [op_put(key, cookie.to_bytes())], [op_get(key)],
                                   what=f"create cookie of {cookie.bookie_id}")
        if not resp.succeeded:
            kv = resp.responses[0].response_range.kvs[0]
            raise VersionConflictError(f"cookie of {cookie.bookie_id}", 0, Cookie.from_bytes(kv.value, kv.mod_revision),
                                       kv.mod_revision)
        return Cookie(**{**asdict(cookie), "version": resp.header.revision})

    async def update(self, cookie: Cookie) -> Cookie:
        """Replace the cookie if it is still at cookie.version."""
        key = self.key(cookie.bookie_id)
        resp = await self.etcd.txn([cmp_mod(key, cookie.version)], [op_put(key, cookie.to_bytes())],
                                   what=f"update cookie of {cookie.bookie_id}")
        if not resp.succeeded:
            raise VersionConflictError(f"cookie of {cookie.bookie_id}", cookie.version)
        return Cookie(**{**asdict(cookie), "version": resp.header.revision})

    async def delete(self, bookie_id: str, version: int | None = None) -> bool:
        """Delete the cookie (only at `version`, when given); True if one was deleted."""
        key = self.key(bookie_id)
        if version is None:
            return (await self.etcd.delete(key)).deleted > 0
        resp = await self.etcd.txn([cmp_mod(key, version)], [op_delete(key)], what=f"delete cookie of {bookie_id}")
        if not resp.succeeded:
            raise VersionConflictError(f"cookie of {bookie_id}", version)
        return True

    async def list(self) -> dict[str, Cookie]:
        resp = await self.etcd.range(self.dir, prefix_end(self.dir))
        return {kv.key[len(self.dir):].decode(): Cookie.from_bytes(kv.value, kv.mod_revision) for kv in resp.kvs}

    async def verify(self, expected: Cookie, dirs: list[str] | None = None) -> str:
        """The bookie's start-up check over etcd and its directories (default: journal + ledger dirs).

        NEW: nothing existed; the cookie is now stored in etcd (CAS) and written to every
        directory. OK: everything agrees. Otherwise CookieMismatchError explaining the fix.
        """
        dirs = dirs if dirs is not None else [expected.journal_dir, *expected.ledger_dirs]
        in_dirs = {d: Cookie.read_dir(d) for d in dict.fromkeys(dirs)}
        verdict = check(expected, await self.get(expected.bookie_id), in_dirs)
        if verdict == NEW:
            try:
                await self.create(expected)
            except VersionConflictError as exc:
                return check(expected, exc.current, in_dirs)
            for d in in_dirs:
                expected.write_dir(d)
        return verdict
