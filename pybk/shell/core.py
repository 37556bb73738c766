"""What every `pybk shell` command shares: its error type, the command registry, the cluster's
location (`resolve_metadata_uri`) and the connections a command opens (`Shell`)."""
from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable


class ShellError(Exception):
    """A command failed in a way the user should read (printed without a traceback)."""


def resolve_metadata_uri(metadata_uri: str | None, data_dir: str | None,
                         environ: dict[str, str] | None = None) -> str:
    """--metadata-uri, else --data-dir's local.json, else $PYBK_METADATA_URI, else the default
    local cluster's local.json ($PYBK_LOCAL_DIR or ./.pybk-local); ShellError if none is found."""
    env = os.environ if environ is None else environ
    if metadata_uri:
        return _check_uri(metadata_uri)
    if data_dir:
        return _uri_from_data_dir(Path(data_dir))
    if env.get("PYBK_METADATA_URI"):
        return _check_uri(env["PYBK_METADATA_URI"])
    default_dir = Path(env.get("PYBK_LOCAL_DIR") or ".pybk-local")
    if (default_dir / "local.json").exists():
        return _uri_from_data_dir(default_dir)
    raise ShellError("no cluster given: pass --metadata-uri etcd://HOST:PORT/PREFIX, set PYBK_METADATA_URI, "
                     "or --data-dir of a local cluster started with `pybk local up`")


def _check_uri(uri: str) -> str:
    if not uri.startswith("etcd://") or "/" not in uri[len("etcd://"):] or len(uri) <= len("etcd://"):
        raise ShellError(f"bad metadata service URI {uri!r}: expected etcd://HOST:PORT[,HOST:PORT]/PREFIX, "
                         "for example etcd://127.0.0.1:2379/pybk")
    return uri


def _uri_from_data_dir(data_dir: Path) -> str:
    path = data_dir / "local.json"
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise ShellError(f"no local cluster in {data_dir} ({path} is missing); start one with "
                         f"`pybk local up -f examples/cluster.yaml --data-dir {data_dir}`") from None
    except (OSError, ValueError) as e:
        raise ShellError(f"cannot read {path}: {e}") from None
    uri = doc.get("metadata_service_uri")
    if not uri:
        raise ShellError(f"{path} has no metadata_service_uri")
    return _check_uri(uri)


@dataclass
class Command:
    name: str
    help: str
    run: Callable[["Shell", argparse.Namespace], Awaitable[Any]]
    arguments: Callable[[argparse.ArgumentParser], None] | None
    render: Callable[[Any, argparse.Namespace], str]


COMMANDS: dict[str, Command] = {}


def command(name: str, help: str, arguments: Callable[[argparse.ArgumentParser], None] | None = None,
            render: Callable[[Any, argparse.Namespace], str] = lambda data, args: json.dumps(data, indent=2)):
    """Register an async command `(shell, args) -> data` under name; `render(data, args)` is its
    text output, and `-o json` prints data itself."""
    def deco(fn: Callable[["Shell", argparse.Namespace], Awaitable[Any]]):
        COMMANDS[name] = Command(name, help, fn, arguments, render)
        return fn
    return deco


class Shell:
    """Connections a command needs, opened on first use and closed at the end."""

    def __init__(self, metadata_uri: str):
        self.metadata_uri = metadata_uri
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
            self._bk = await BookKeeper.connect(self.metadata_uri)
        return self._bk

    async def close(self) -> None:
        if self._bk is not None:
            await self._bk.close()
        if self._store is not None:
            await self._store.close()

