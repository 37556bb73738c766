"""`pybk bookie`'s settings: the option objects its components take, as the loader builds them.

`pybk.config.load(BookieSettings, args, config.BOOKIE)` fills every field from the option table
(flag > environment > file > default); the defaults are the table's.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pybk.config import BOOKIE, Common, option_field
from pybk.eventloop import EventLoop
from pybk.recovery.options import RecoveryOptions
from pybk.security.server import SecurityOptions

from .bookie import StorageOptions
from .gc import Housekeeping
from .limits import Limits


@dataclass(frozen=True)
class ServerOptions:
    """Who the bookie is, where it listens and keeps its files, and how it registers."""

    host: str = option_field("host")
    port: int = option_field("port")
    http_port: int = option_field("http_port", BOOKIE)
    bookie_id: str | None = option_field("bookie_id")
    zone: str = option_field("zone")
    rack: str = option_field("rack")
    journal_dir: str | None = option_field("journal_dir")
    ledger_dir: tuple[str, ...] | None = option_field("ledger_dir")
    metadata_uri: str | None = option_field("metadata_uri")
    registration_ttl: int = option_field("registration_ttl")

    @property
    def journal_path(self) -> Path:
        return Path(self.journal_dir or "")

    @property
    def ledger_paths(self) -> list[Path]:
        return [Path(d) for d in self.ledger_dir or ()]


@dataclass(frozen=True)
class ConnectionOptions:
    """What the gRPC port allows connections (transport.ConnectionLimits once the open-files
    limit is known), and the descriptors kept back for the bookie's own files."""

    max_connections: int = option_field("max_connections")
    max_connections_per_peer: int = option_field("max_connections_per_peer")
    reserved_descriptors: int = option_field("reserved_descriptors")
    handshake_timeout: float = option_field("handshake_timeout")
    idle_timeout: float = option_field("idle_timeout")
    keepalive_interval: float = option_field("keepalive_interval")
    keepalive_timeout: float = option_field("keepalive_timeout")


@dataclass(frozen=True)
class BookieSettings:
    """Everything `pybk bookie` is configured with, grouped by the component that takes it."""

    common: Common = field(default_factory=Common)
    event_loop: EventLoop = option_field("event_loop")
    rebuild_index: bool = option_field("rebuild_index")  # rebuild the index and exit instead of serving
    autorecovery: bool = option_field("autorecovery")    # run autorecovery in this process too
    server: ServerOptions = field(default_factory=ServerOptions)
    storage: StorageOptions = field(default_factory=StorageOptions)
    limits: Limits = field(default_factory=Limits)
    connections: ConnectionOptions = field(default_factory=ConnectionOptions)
    housekeeping: Housekeeping = field(default_factory=Housekeeping)
    security: SecurityOptions = field(default_factory=SecurityOptions)
    recovery: RecoveryOptions = field(default_factory=RecoveryOptions)
