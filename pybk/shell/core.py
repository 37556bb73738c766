"""What every `pybk shell` command shares: its error type, the command registry, the cluster's
location and credentials (`resolve_cluster`) and the connections a command opens (`Shell`)."""
from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable, Mapping

from pybk.local.client import LocalClient, default_data_dir, overlay, security_for
from pybk.security.settings import ClientSecurity


class ShellError(Exception):
    """A command failed in a way the user should read (printed without a traceback)."""


def resolve_cluster(metadata_uri: str | None, data_dir: str | None,
                    environ: Mapping[str, str] | None = None) -> LocalClient:
    """Which cluster and credentials: --metadata-uri, else --data-dir's local.json, else
    $PYBK_METADATA_URI, else the default local cluster's local.json ($PYBK_LOCAL_DIR or
    ./.pybk-local); ShellError if none is found. The credentials are local.json's `security`
    (a cluster started `--secure`, also when its URI is given), each overridden by the
    environment's credential variables (`PYBK_TLS_CA`, `PYBK_TOKEN_FILE`, ...)."""
    env = os.environ if environ is None else environ
    if metadata_uri:
        uri = _check_uri(metadata_uri)
        return LocalClient(uri, security_for(uri, env))
    if data_dir:
        return _from_data_dir(Path(data_dir), env)
    if env.get("PYBK_METADATA_URI"):
        uri = _check_uri(env["PYBK_METADATA_URI"])
        return LocalClient(uri, security_for(uri, env))
    default_dir = default_data_dir(env)
    if (default_dir / "local.json").exists():
        return _from_data_dir(default_dir, env)
    raise ShellError("no cluster given: pass --metadata-uri etcd://HOST:PORT/PREFIX, set PYBK_METADATA_URI, "
                     "or --data-dir of a local cluster started with `pybk local up`")


def resolve_metadata_uri(metadata_uri: str | None, data_dir: str | None,
                         environ: Mapping[str, str] | None = None) -> str:
    """The metadata URI `resolve_cluster` finds."""
    return resolve_cluster(metadata_uri, data_dir, environ).metadata_uri


def _check_uri(uri: str) -> str:
    if not uri.startswith("etcd://") or "/" not in uri[len("etcd://"):] or len(uri) <= len("etcd://"):
        raise ShellError(f"bad metadata service URI {uri!r}: expected etcd://HOST:PORT[,HOST:PORT]/PREFIX, "
                         "for example etcd://127.0.0.1:2379/pybk")
    return uri


def _from_data_dir(data_dir: Path, environ: Mapping[str, str]) -> LocalClient:
    path = data_dir / "local.json"
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise ShellError(f"no local cluster in {data_dir} ({path} is missing); start one with "
                         f"`pybk local up -f examples/cluster.yaml --data-dir {data_dir}`") from None
    except (OSError, ValueError) as e:
        raise ShellError(f"cannot read {path}: {e}") from None
    if not doc.get("metadata_service_uri"):
        raise ShellError(f"{path} has no metadata_service_uri")
    local = LocalClient.of(doc)
    return LocalClient(_check_uri(local.metadata_uri), overlay(local.security, environ))


@dataclass
class Command:
    name: str
    help: str
    run: Callable[["Shell", argparse.Namespace], Awaitable[Any]]
    arguments: Callable[[argparse.ArgumentParser], None] | None
    render: Callable[[Any, argparse.Namespace], str]
    stream: bool = False  # prints its own output while it runs (and stops on Ctrl-C); returns None


COMMANDS: dict[str, Command] = {}


def command(name: str, help: str, arguments: Callable[[argparse.ArgumentParser], None] | None = None,
            render: Callable[[Any, argparse.Namespace], str] = lambda data, args: json.dumps(data, indent=2),
            stream: bool = False):
    """Register an async command `(shell, args) -> data` under name; `render(data, args)` is its
    text output, and `-o json` prints data itself. A `stream` command prints as it goes instead."""
    def deco(fn: Callable[["Shell", argparse.Namespace], Awaitable[Any]]):
        COMMANDS[name] = Command(name, help, fn, arguments, render, stream)
        return fn
    return deco


class Shell:
    """Connections a command needs, opened on first use and closed at the end, with the
    credentials `security` (None: `ClientSecurity.from_env()`, the library's default)."""

    def __init__(self, metadata_uri: str, security: ClientSecurity | None = None):
        self.metadata_uri = metadata_uri
        self.security = security
        self._store = None
        self._bk = None

    async def store(self):
        """The metadata store (pybk.meta.MetadataStore)."""
        if self._store is None:
            from pybk.meta import MetadataStore
            self._store = await MetadataStore.connect(self.metadata_uri)
        return self._store

    async def bk(self):
        """The ledger client (pybk.client.BookKeeper)."""
        if self._bk is None:
            from pybk.client import BookKeeper
            self._bk = await BookKeeper.connect(self.metadata_uri, security=self.security)
        return self._bk

    async def close(self) -> None:
        if self._bk is not None:
            await self._bk.close()
        if self._store is not None:
            await self._store.close()
