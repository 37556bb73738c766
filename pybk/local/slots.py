"""The stable identity of each local process: bookie ordinal N is always `bookie-N`, with the
same ports and directories, so a restarted bookie keeps its cookie; etcd and autorecovery keep
their ports too. Ports are chosen once and recorded in DIR/ports.json."""
from __future__ import annotations

import json
import logging
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .datadir import PORTS_JSON, write_json
from .process import free_port

log = logging.getLogger("pybk.local")

BOOKIE_PREFIX = "bookie-"


def bookie_id(ordinal: int) -> str:
    """The id of local bookie ordinal N."""
    return f"{BOOKIE_PREFIX}{ordinal}"


def ordinal_of(name: str) -> int | None:
    """N for a local bookie id (or data dir name) `bookie-N`, else None."""
    tail = name[len(BOOKIE_PREFIX):] if name.startswith(BOOKIE_PREFIX) else ""
    return int(tail) if tail.isdigit() else None


def port_free(host: str, port: int) -> bool:
    """True if nothing listens on host:port (it could be bound now)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


@dataclass
class BookieSlot:
    """The stable identity of bookie ordinal N: id, ports and directories never change."""

    ordinal: int
    host: str
    grpc_port: int
    http_port: int
    base_dir: Path

    @property
    def bookie_id(self) -> str:
        return bookie_id(self.ordinal)

    @property
    def journal_dir(self) -> Path:
        return self.base_dir / self.bookie_id / "journal"

    @property
    def ledger_dirs(self) -> list[Path]:
        return [self.base_dir / self.bookie_id / "ledgers"]

    @property
    def log_path(self) -> Path:
        return self.base_dir / f"{self.bookie_id}.log"

    @property
    def grpc(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def http(self) -> str:
        return f"{self.host}:{self.http_port}"


class Ports:
    """DIR/ports.json: {"etcd": {...}, "bookies": {"bookie-N": {...}}, "autorecovery": {...}}."""

    def __init__(self, data_dir: Path, host: str) -> None:
        self.path = data_dir / PORTS_JSON
        self.host = host
        try:
            self._doc: dict[str, Any] = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self._doc = {"etcd": {}, "bookies": {}, "autorecovery": {}}

    def port(self, *where: str, renew: bool = False) -> int:
        """The port recorded at `where` (e.g. "bookies", "bookie-1", "grpc"), or a new free one at
        first use, if another process took the recorded one meanwhile, or with renew (when it took
        it between this check and its use); a new one is recorded."""
        *sections, key = where
        section = self._doc
        for name in sections:
            section = section.setdefault(name, {})
        port = section.get(key)
        if port and not renew and port_free(self.host, port):
            return port
        if port:
            log.warning("port %s recorded for %s is taken by another process; choosing a new one", port, key)
        taken = set(_ports_in(self._doc))
        while True:
            candidate = free_port(self.host)
            if candidate not in taken:
                section[key] = candidate
                write_json(self.path, self._doc)
                return candidate

    def bookie_slot(self, ordinal: int, base_dir: Path) -> BookieSlot:
        """Bookie ordinal N's id, ports and dirs for starting it."""
        name = bookie_id(ordinal)
        return BookieSlot(ordinal, self.host, self.port("bookies", name, "grpc"),
                          self.port("bookies", name, "http"), base_dir)


def _ports_in(doc: Any):
    if isinstance(doc, dict):
        for value in doc.values():
            yield from _ports_in(value)
    elif isinstance(doc, int):
        yield doc
