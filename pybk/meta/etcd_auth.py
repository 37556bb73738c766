"""Turn on etcd authentication for one pybk cluster (its key prefix): who may read and who may
write its metadata.

    await enable_auth("etcd://127.0.0.1:2379/pybk?tls_ca=...", root_password,
                      {"pybk": (password, "readwrite"), "pybk-reader": (password, "read")})

creates etcd's `root` user (etcd refuses to turn auth on without it) with the `root` role, one
role per access level on the prefix (`<prefix>-readwrite`: read and write every key under
`/<prefix>/`; `<prefix>-read`: read them), the users bound to those roles, and then turns
authentication on. pybk touches no key outside its prefix: ledgers, id blocks, the bookie
registry, cookies, locks and elections all live under it; leases (the session), status and
compaction need no key permission in etcd 3.5 (revoking a lease needs write on the keys
attached to it, all under the prefix).

Idempotent: run again (auth already on: it authenticates as root with root_password) it sets
the users' passwords and roles to what it is given and changes nothing else. Also a command:
`python -m pybk.meta.etcd_auth --metadata-uri URI --root-password-file F --user NAME=FILE:ACCESS ...`
(passwords in files only).
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import enum
import sys
from typing import Mapping, Sequence

import grpc
from aetcd import rpc

from . import uri as uri_mod
from .errors import MetadataAuthError, MetadataError
from .etcd import Etcd, Refusal, classify, prefix_end

__all__ = ["EtcdAccess", "ROOT", "enable_auth", "role_name"]

ROOT = "root"


class EtcdAccess(enum.Enum):
    """What an etcd user may do with a pybk cluster's keys."""

    READWRITE = "readwrite"
    READ = "read"

    @property
    def permission(self) -> int:
        return rpc.Permission.READWRITE if self is EtcdAccess.READWRITE else rpc.Permission.READ


def role_name(prefix: str, access: EtcdAccess) -> str:
    """The etcd role that grants `access` to the keys of the cluster at `prefix` (e.g. `pybk-read`)."""
    return f"{prefix}-{access.value}"


async def enable_auth(uri: str | uri_mod.MetadataUri, root_password: str,
                      users: Mapping[str, tuple[str, EtcdAccess | str]]) -> None:
    """Create root, the prefix's roles and `users` ({name: (password, access)}), then turn etcd
    authentication on. uri: the cluster's metadata URI (endpoints, prefix, TLS options; a user
    in it is ignored: this acts as root). MetadataAuthError if auth is on and root_password is
    not root's; ValueError for an unknown access or a user named root."""
    parsed = uri if isinstance(uri, uri_mod.MetadataUri) else uri_mod.parse(uri)
    wanted = {name: (password, EtcdAccess(access)) for name, (password, access) in users.items()}
    if ROOT in wanted:
        raise ValueError("the root user is made from root_password; do not list it in users")
    etcd = Etcd(dataclasses.replace(parsed, user=None, password_file=None))
    try:
        admin = _Admin(etcd)
        await admin.login(root_password)
        await admin.user(ROOT, root_password)
        await admin.role(ROOT)
        await admin.grant(ROOT, ROOT)
        key = parsed.key_prefix
        for access in EtcdAccess:
            role = role_name(parsed.prefix, access)
            await admin.role(role)
            await admin.call(etcd.auth.RoleGrantPermission, rpc.AuthRoleGrantPermissionRequest(
                name=role, perm=rpc.Permission(permType=access.permission, key=key, range_end=prefix_end(key))),
                f"grant {access.value} on {key.decode()} to role {role!r}")
        ours = {role_name(parsed.prefix, a) for a in EtcdAccess}
        for name, (password, access) in wanted.items():
            role = role_name(parsed.prefix, access)
            await admin.user(name, password)
            held = await admin.call(etcd.auth.UserGet, rpc.AuthUserGetRequest(name=name), f"get user {name!r}")
            for other in (set(held.roles) & ours) - {role}:
                await admin.call(etcd.auth.UserRevokeRole, rpc.AuthUserRevokeRoleRequest(name=name, role=other),
                                 f"revoke role {other!r} from user {name!r}")
            await admin.grant(name, role)
        await admin.call(etcd.auth.AuthEnable, rpc.AuthEnableRequest(), "enable authentication")
    finally:
        await etcd.close()


class _Admin:
    """etcd's Auth calls as root (once auth is on) or anonymously (while it is off)."""

    def __init__(self, etcd: Etcd):
        self.etcd = etcd
        self.token: str | None = None

    async def call(self, method, request, what: str, exists_ok: bool = False):
        try:
            return await method(request, timeout=self.etcd.timeout, wait_for_ready=True,
                                metadata=self.etcd.call_metadata(self.token))
        except grpc.aio.AioRpcError as exc:
            if exists_ok and classify(exc.details()) == Refusal.EXISTS:
                return None
            raise await self.etcd.translate(exc, what) from None

    async def login(self, root_password: str) -> None:
        """Authenticate as root if etcd has auth on already (keeping the token), else nothing."""
        try:
            resp = await self.etcd.auth.Authenticate(rpc.AuthenticateRequest(name=ROOT, password=root_password),
                                                     timeout=self.etcd.timeout, wait_for_ready=True)
        except grpc.aio.AioRpcError as exc:
            refusal = classify(exc.details())
            if refusal == Refusal.AUTH_NOT_ENABLED:
                return
            if refusal == Refusal.AUTH_FAILED:
                raise MetadataAuthError(f"etcd at {self.etcd.endpoints} has authentication on and refused user "
                                        f"{ROOT!r}: wrong root password") from None
            raise await self.etcd.translate(exc, f"authenticate as user {ROOT!r}") from None
        self.token = resp.token

    async def user(self, name: str, password: str) -> None:
        """Create the user with this password, or set the password of an existing one unless it is
        that already (setting it makes etcd drop the user's tokens)."""
        added = await self.call(self.etcd.auth.UserAdd, rpc.AuthUserAddRequest(name=name, password=password),
                                f"add user {name!r}", exists_ok=True)
        if added is None and not await self._password_is(name, password):
            await self.call(self.etcd.auth.UserChangePassword,
                            rpc.AuthUserChangePasswordRequest(name=name, password=password),
                            f"set the password of user {name!r}")

    async def _password_is(self, name: str, password: str) -> bool:
        """Whether etcd (with auth on) authenticates the user with this password."""
        if self.token is None:
            return False
        try:
            await self.etcd.auth.Authenticate(rpc.AuthenticateRequest(name=name, password=password),
                                              timeout=self.etcd.timeout, wait_for_ready=True)
        except grpc.aio.AioRpcError as exc:
            if classify(exc.details()) == Refusal.AUTH_FAILED:
                return False
            raise await self.etcd.translate(exc, f"check the password of user {name!r}") from None
        return True

    async def role(self, name: str) -> None:
        await self.call(self.etcd.auth.RoleAdd, rpc.AuthRoleAddRequest(name=name), f"add role {name!r}",
                        exists_ok=True)

    async def grant(self, user: str, role: str) -> None:
        await self.call(self.etcd.auth.UserGrantRole, rpc.AuthUserGrantRoleRequest(user=user, role=role),
                        f"grant role {role!r} to user {user!r}")


def _user_arg(text: str) -> tuple[str, str, EtcdAccess]:
    """NAME=PASSWORD_FILE:ACCESS."""
    name, eq, rest = text.partition("=")
    path, colon, access = rest.rpartition(":")
    if not (eq and colon and name and path):
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=PASSWORD_FILE:ACCESS (access: read or readwrite)")
    try:
        return name, path, EtcdAccess(access)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: access {access!r} is neither read nor readwrite") from None


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m pybk.meta.etcd_auth`: enable_auth from the command line, passwords from files."""
    parser = argparse.ArgumentParser(prog="python -m pybk.meta.etcd_auth", description=__doc__.split("\n\n")[0])
    parser.add_argument("--metadata-uri", required=True, help="the cluster's etcd:// URI (endpoints, prefix, tls_*)")
    parser.add_argument("--root-password-file", required=True, help="file holding etcd's root password")
    parser.add_argument("--user", action="append", type=_user_arg, default=[], metavar="NAME=PASSWORD_FILE:ACCESS",
                        help="an etcd user for this cluster; access is read or readwrite (repeatable)")
    args = parser.parse_args(argv)
    try:
        root = uri_mod.read_secret("--root-password-file", args.root_password_file, source="option")
        users = {name: (uri_mod.read_secret(f"--user {name}", path, source="option"), access)
                 for name, path, access in args.user}
        asyncio.run(enable_auth(args.metadata_uri, root, users))
    except (MetadataError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"etcd authentication is on for {uri_mod.parse(args.metadata_uri).key_prefix.decode()} "
          f"({len(users)} user(s) besides root)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
