"""Every option of every long-running pybk process, declared once, and the one loader for them.

An `Option` is one setting: its name (also its YAML key), type, default and help; its flag
(`--name-with-dashes`) and environment variable (`PYBK_NAME`) derive from the name unless declared.
A `Process` lists the options one command takes; an option several processes take is declared once
and listed in each (`COMMON` is in every process: an option added there reaches all of them).

From the declarations come the argparse flags (`add_options`), the merge of flag > environment >
YAML file (`--config`) > default with validation (`resolve`, which also refuses any `PYBK_*`
variable no pybk process knows, naming it, and leaves another process's setting alone) and the
option reference `docs/options.md`
(`reference`; regenerate it with `python -m pybk.config`).

A process does not see the merged values as a dict: `load` builds its frozen settings object, a
dataclass whose fields are the option objects its components take (a bookie's `JournalOptions`,
`Limits`, ...). Each field of such an options dataclass names its option with `option_field`,
which also gives it the table's default, so a default is declared here and nowhere else; `build`
fills the dataclasses and refuses a settings class that leaves an option of its process unused,
and `effective` reads the values back out of live components by option name.
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import logging
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, TypeVar, get_type_hints

import yaml

from pybk.eventloop import EventLoop, parse_event_loop
from pybk import logformat
from pybk.logformat import LogFormat, parse_log_format

ENV_PREFIX = "PYBK_"
log = logging.getLogger("pybk.config")
REFERENCE = Path(__file__).resolve().parents[1] / "docs" / "options.md"

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000 ** 2, "mb": 1000 ** 2, "mib": 1024 ** 2,
          "g": 1000 ** 3, "gb": 1000 ** 3, "gib": 1024 ** 3, "t": 1000 ** 4, "tb": 1000 ** 4, "tib": 1024 ** 4}
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def parse_size(text: str | int) -> int:
    """'64MiB', '1GB', '4096' -> bytes."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"not a size: {text!r} (use e.g. 4096, 64KiB, 16MiB, 1GB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def parse_bool(text: str | bool) -> bool:
    """'true'/'yes'/'on'/'1' or 'false'/'no'/'off'/'0' (any case) -> bool."""
    if isinstance(text, bool):
        return text
    t = str(text).strip().lower()
    if t in ("1", "true", "yes", "on"):
        return True
    if t in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {text!r} (use true or false)")


def parse_log_level(text: str) -> str:
    """A logging level name, upper-cased."""
    level = str(text).strip().upper()
    if level not in LOG_LEVELS:
        raise ValueError(f"not a log level: {text!r} (use {', '.join(LOG_LEVELS)})")
    return level


@dataclass(frozen=True)
class Number:
    """An integer or real option's type, optionally with a lower bound: `Number(float, 0)`."""

    kind: type
    minimum: float | None = None

    def __call__(self, value: Any) -> int | float:
        if isinstance(value, bool):
            raise ValueError(f"not a number: {value!r}")
        try:
            number = self.kind(value)
        except (TypeError, ValueError):
            raise ValueError(f"not {'an integer' if self.kind is int else 'a number'}: {value!r}") from None
        if self.minimum is not None and number < self.minimum:
            raise ValueError(f"must be >= {self.minimum:g}, got {value!r}")
        return number

    def __str__(self) -> str:
        kind = "integer" if self.kind is int else "number"
        return kind if self.minimum is None else f"{kind} >= {self.minimum:g}"


_TYPE_NAMES: dict[Callable[[Any], Any], str] = {str: "string", parse_size: "size", parse_bool: "boolean",
                                                 parse_log_level: "log level", parse_event_loop: "event loop",
                                                 parse_log_format: "log format"}


@dataclass(frozen=True)
class Option:
    """One setting: flag `--name-with-dashes`, environment variable `PYBK_NAME_IN_CAPITALS` (unless
    `env` names another), YAML key `name` (dashes also accepted). A repeatable option takes its
    flag several times, a comma-separated variable or a YAML list."""

    name: str
    help: str
    default: Any = None
    type: Callable[[Any], Any] = str
    repeatable: bool = False
    required: bool = False
    metavar: str | None = None
    env: str = ""
    short: str | None = None
    secret: bool = False  # reported as set, never by value (`effective`)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def variable(self) -> str:
        return self.env or ENV_PREFIX + self.name.upper()

    @property
    def type_name(self) -> str:
        name = _TYPE_NAMES.get(self.type) or str(self.type)
        return f"list of {name}" if self.repeatable else name

    def convert(self, value: Any) -> Any:
        """The value (a list of them when repeatable) in this option's type; ValueError if malformed."""
        if self.repeatable:
            return [self.type(v) for v in (value if isinstance(value, list) else [value])]
        return self.type(value)

    def value_in(self, environ: Mapping[str, str]) -> Any:
        """This option's value in environ, else its default (converted: `value_in({})` is the
        default option_field gives). ConfigError naming the variable if malformed."""
        if self.variable not in environ:
            return None if self.default is None else self.convert(self.default)
        raw = environ[self.variable]
        return _convert(self, [s for s in raw.split(",") if s] if self.repeatable else raw, self.variable)


class ConfigError(ValueError):
    """A setting is missing, unknown or malformed; the message's first line names it and where it came from."""


@dataclass(frozen=True)
class Process:
    """One command's settings: its options, plus checks that relate several of them (each returns
    a problem or None)."""

    command: str
    options: tuple[Option, ...]
    checks: tuple[Callable[[Mapping[str, Any]], str | None], ...] = ()

    @property
    def title(self) -> str:
        return f"pybk {self.command}"

    def option(self, name: str) -> Option | None:
        return next((o for o in self.options if o.name == name), None)


# ---------------------------------------------------------------------------------------------
# The declarations.

# In every process.
CONFIG = Option("config", "YAML file of settings (keys are the option names, e.g. log_level); flags "
                "override the environment, which overrides the file", metavar="FILE")
LOG_LEVEL = Option("log_level", "DEBUG, INFO, WARNING or ERROR", "INFO", parse_log_level)
LOG_FORMAT = Option("log_format", "text (lines for people) or json (one object per line with timestamp, level, "
                    "logger, message and context such as ledger_id and bookie_id; the image's default)",
                    LogFormat.TEXT, parse_log_format)
# TLS and the credential this process presents (docs/security.md); clients read the same PYBK_* names.
TLS_CERT = Option("tls_cert", "this process's TLS certificate (PEM): served on its gRPC and admin HTTP ports, "
                  "presented as client certificate when it calls bookies; reloaded when the file changes",
                  metavar="FILE")
TLS_KEY = Option("tls_key", "the private key of tls_cert (PEM)", metavar="FILE")
TLS_CA = Option("tls_ca", "CA bundle (PEM): clients verify servers with it, servers verify client "
                "certificates with it", metavar="FILE")
TLS_SERVER_NAME = Option("tls_server_name", "name this process expects in the certificates of the servers it "
                         "calls (default: the host it dials)", metavar="NAME")
TOKEN_FILE = Option("token_file", "file holding the bearer token this process presents when it calls bookies or "
                    "autorecovery", metavar="FILE")
COMMON = (CONFIG, LOG_LEVEL, LOG_FORMAT, TLS_CERT, TLS_KEY, TLS_CA, TLS_SERVER_NAME, TOKEN_FILE)
# In the asyncio servers (bookie, autorecovery); the operator runs on kopf's loop.
EVENT_LOOP = Option("event_loop", "the event loop to run on: auto (uvloop when installed, else asyncio), asyncio "
                    "or uvloop (pip install 'pybk[uvloop]'; less CPU per message)", EventLoop.AUTO,
                    parse_event_loop)

DEFAULT_OPEN_HTTP_PATHS = ("/heartbeat", "/metrics", "/api/v1/bookie/is_ready")
# Who may call a server (bookie, autorecovery).
SERVER_AUTH = (
    Option("auth_file", "who may call this server, as which role (YAML: tokens and certificate subjects, see "
           "docs/security.md); setting it turns authentication on; re-read when it changes", metavar="FILE"),
    Option("open_http_paths", "admin HTTP paths anyone may GET without credentials (a flag value may also list several, comma-separated)", list(DEFAULT_OPEN_HTTP_PATHS),
           repeatable=True, metavar="PATH"),
    Option("tls_client_auth", "require a client certificate signed by tls_ca on the gRPC port (mTLS); "
           "without it both ports accept an optional one (verified against tls_ca), and a caller that sends "
           "one and no token is known by its common name", False, parse_bool),
)

METADATA_URI = Option("metadata_uri", "metadata service, etcd://host:port[,host:port]/prefix", metavar="URI")

# Autorecovery's tuning: in `pybk autorecovery`, and in `pybk bookie` for `--autorecovery`.
RECOVERY_TUNING = (
    Option("lost_bookie_delay", "seconds a bookie must be gone from the registry before its ledgers are marked "
           "under-replicated", 60.0, Number(float, 0)),
    Option("audit_interval", "seconds between periodic full checks (every ledger's entries on every bookie via "
           "ListEntries); 0 disables", 3600.0, Number(float, 0)),
    Option("open_ledger_grace", "seconds to leave an open ledger's last fragment to its writer before fencing and "
           "recovering the ledger", 30.0, Number(float, 0)),
    Option("ledger_password", "a ledger password autorecovery may use. Not needed to re-replicate and fence: "
           "autorecovery does that without ledgers' keys, with its admin role. Needed to verify MAC digests "
           "while copying (else only length and ids are checked). The metadata's password hash picks the "
           "right one; the empty password is always tried",
           repeatable=True, metavar="PASSWORD", env="PYBK_LEDGER_PASSWORDS", secret=True),
    Option("replication_batch", "entries per read/add batch when copying", 4096, Number(int, 1)),
    Option("parallel_ledgers", "ledgers one worker replicates at once", 4,
           Number(int, 1), env="PYBK_RECOVERY_PARALLEL_LEDGERS"),
    Option("parallel_runs", "copy runs (read_range streams) in flight per fragment", 4,
           Number(int, 1), env="PYBK_RECOVERY_PARALLEL_RUNS"),
    Option("poll_interval", "seconds between looks at the registry and the markers", 1.0,
           Number(float, 0), env="PYBK_RECOVERY_POLL_INTERVAL"),
    Option("job_gc_interval", "seconds between passes of the write-job garbage collector on the elected auditor "
           "(as `pybk shell gc-jobs`: deletes ledgers of Spark write jobs that aborted or never committed, "
           "finishes interrupted commits); 0 disables", 600.0, Number(float, 0)),
    Option("job_gc_grace", "seconds after a write job's ledger was created before the garbage collector aborts the "
           "job if it has not committed or aborted (a job running longer fails its commit)",
           86400.0, Number(float, 0)),
)


def _water_marks(cfg: Mapping[str, Any]) -> str | None:
    if not 0 < cfg["low_water_mark"] <= cfg["high_water_mark"]:
        return "need 0 < low_water_mark <= high_water_mark"
    return None


def _message_size(cfg: Mapping[str, Any]) -> str | None:
    # a read answer holds up to 1MiB of entries plus one more entry
    if cfg["max_message_size"] and cfg["max_message_size"] < cfg["max_entry_size"] + 2 * 1024 * 1024:
        return "max_message_size must exceed max_entry_size by at least 2MiB (or be 0: max_entry_size + 4MiB)"
    return None


BOOKIE = Process("bookie", COMMON + (EVENT_LOOP,
    dataclasses.replace(METADATA_URI, help=METADATA_URI.help + "; without it the bookie runs unregistered "
                        "(no cookie in etcd, no registration)"),
    Option("host", "address to listen on and to advertise", "127.0.0.1"),
    Option("bookie_id", "this bookie's id in the cluster (default host:port)", metavar="ID"),
    Option("port", "gRPC port of the data plane", 3181, Number(int, 0)),
    Option("http_port", "admin HTTP port (/heartbeat, /metrics, /api/v1/bookie/...)", 8000, Number(int, 0)),
    Option("journal_dir", "journal directory (ideally on its own disk)", required=True, metavar="DIR"),
    Option("ledger_dir", "ledger directory for entry logs (the first also holds the LMDB index)",
           repeatable=True, required=True, metavar="DIR"),
    Option("zone", "failure zone advertised in the registration (placement spreads across zones)", ""),
    Option("rack", "rack advertised in the registration", ""),
    Option("high_water_mark", "disk usage fraction at or above which the bookie turns read-only", 0.95,
           Number(float)),
    Option("low_water_mark", "disk usage fraction below which a disk-read-only bookie is writable again",
           0.90, Number(float)),
    Option("disk_capacity", "byte budget for this bookie's dirs (e.g. 10GiB); water marks then apply to the "
           "bytes in its dirs over this budget instead of the whole filesystem; 0 = filesystem", 0, parse_size),
    Option("disk_check_interval", "seconds between disk usage checks", 1.0, Number(float, 0)),
    Option("journal_group_wait", "seconds the journal writer waits to gather more adds into one fdatasync "
           "(0 = take whatever is queued)", 0.0, Number(float, 0)),
    Option("journal_group_max_bytes", "most bytes written per journal group commit", "16MiB", parse_size),
    Option("journal_inline_bytes", "journal group commits up to this size are written and fdatasync'd on the "
           "event loop instead of a worker thread: lower latency for lone adds (0 = always a thread)",
           "64KiB", parse_size),
    Option("journal_max_file_size", "journal files rotate at this size", "256MiB", parse_size),
    Option("journal_fsync", "fdatasync the journal before acknowledging adds (false only for experiments)",
           True, parse_bool),
    Option("journal_prealloc_size", "journal files are preallocated in chunks of this size, so that a file cut "
           "short is evident at start (0 = no preallocation: a cut newest file then looks like a torn tail)",
           "16MiB", parse_size),
    Option("accept_journal_loss", "start even though journal files are missing or cut: log the lost range and "
           "mark every ledger this bookie is in under-replicated so autorecovery copies the entries back "
           "(without it such a bookie refuses to start)", False, parse_bool),
    Option("rebuild_index", "do not serve: rebuild the LMDB index from the entry logs and the journal (master "
           "keys of ledgers created by earlier releases also from the ledger metadata with --metadata-uri), keep "
           "the old one aside, and exit. Run it with the bookie stopped, as the user owning its dirs", False, parse_bool),
    Option("checkpoint_interval", "seconds between checkpoints of the write cache", 30.0, Number(float, 0)),
    Option("checkpoint_bytes", "checkpoint early when the write cache holds this much", "128MiB", parse_size),
    Option("max_write_cache_bytes", "adds get TOO_MANY_REQUESTS while the write cache, checkpoint in "
           "flight and journal backlog hold more than this", "1GiB", parse_size),
    Option("entrylog_max_file_size", "entry log files rotate at this size", "1GiB", parse_size),
    Option("entrylog_direct_io", "checkpoints write entry logs with direct I/O (O_DIRECT, from one 8 MiB buffer "
           "per ledger dir), past the page cache: less CPU a byte, and no checkpoint's worth of dirty pages to "
           "stall the journal's fdatasyncs; where the file system refuses it (at open, or its writes) entry logs "
           "are written through the page cache, with a warning", True, parse_bool),
    Option("max_entry_size", "largest entry body accepted; bigger ones get BAD_REQUEST", "5MiB", parse_size),
    Option("max_message_size", "largest gRPC message the bookie receives or sends (as BookKeeper's "
           "nettyMaxFrameSizeBytes); a bigger one ends its call with RESOURCE_EXHAUSTED before it is held in "
           "memory. 0 = max_entry_size + 4MiB. Clients send at most 9MiB (the default): a smaller limit needs them "
           "configured alike", 0, parse_size),
    Option("max_add_bytes_in_flight", "entry bytes of adds received but not yet answered, over all connections; "
           "adds beyond it get TOO_MANY_REQUESTS (clients resend them later)", "256MiB", parse_size),
    Option("max_add_bytes_in_flight_per_connection", "the same cap for one client's Add stream", "64MiB",
           parse_size),
    Option("max_read_buffer_bytes", "bytes of read answers handed to gRPC and not yet taken by their clients, "
           "over all Read streams; further reads wait until slow readers take theirs", "64MiB", parse_size),
    Option("max_client_memory", "bytes the bookie's gRPC port holds for all its clients together: requests "
           "received ahead of their processing and answers not yet read; above half of it no client gets "
           "flow-control credit ahead of processing, above all of it the connection holding the most is "
           "ended (GOAWAY ENHANCE_YOUR_CALM)", "512MiB", parse_size),
    Option("read_stream_timeout", "seconds a Read stream may wait for its client to take the next answer "
           "before the bookie cancels it", 30.0, Number(float, 0.1)),
    Option("max_connections", "gRPC connections held at once, from all clients; one more is closed as soon "
           "as it is accepted (before TLS), counted in pybk_bookie_connections_refused_total. Lowered at start to "
           "what the open-files limit allows after reserved_descriptors. 0 = as many as that allows", 4096,
           Number(int, 0)),
    Option("max_connections_per_peer", "gRPC connections held at once from one IP address (clients behind one "
           "NAT share theirs); one more is closed as it is accepted. 0 = no limit below max_connections", 512,
           Number(int, 0)),
    Option("reserved_descriptors", "file descriptors kept for the bookie's own files and calls (journal, entry "
           "logs, index, checkpoints, admin HTTP, etcd, autorecovery's connections) whatever clients do: at start "
           "the bookie raises its open-files limit to the hard limit, and max_connections is at most that limit "
           "less this; the bookie refuses to start if fewer than 16 connections would be left", 1024,
           Number(int, 0)),
    Option("handshake_timeout", "seconds a new gRPC connection has to finish its TLS handshake and send the "
           "HTTP/2 connection preface; then it is dropped (0 = no limit)", 10.0, Number(float, 0)),
    Option("idle_timeout", "seconds a gRPC connection with no call open is kept; then the bookie closes it with "
           "a GOAWAY (NO_ERROR) and clients reconnect for their next call (0 = kept)", 300.0, Number(float, 0)),
    Option("keepalive_interval", "seconds a gRPC connection may be silent before the bookie sends it a PING "
           "(0 = no PINGs; clients ping every 10 s themselves)", 60.0, Number(float, 0)),
    Option("keepalive_timeout", "seconds the bookie waits for anything from a client after its PING; then it "
           "drops the connection (a client gone without closing it)", 20.0, Number(float, 0.1)),
    Option("gc_interval", "seconds between garbage collections of ledgers deleted from the metadata "
           "(0 = only on request: POST /api/v1/bookie/gc)", 600.0, Number(float, 0)),
    Option("scrub_interval", "seconds between scrubs, which check every checkpointed entry against its "
           "entry-log record (CRC32C) and give up unreadable ones so autorecovery copies them back, as "
           "BookKeeper's localScrubPeriod (0 = only on request: POST /api/v1/bookie/scrub)", 86400.0,
           Number(float, 0)),
    Option("compaction_threshold", "after garbage collection, rewrite entry logs whose live fraction is "
           "below this (0 = never)", 0.5, Number(float, 0)),
    Option("registration_ttl", "seconds of the etcd lease that carries the registration", 10, Number(int, 1)),
    Option("autorecovery", "also run autorecovery (auditor candidate + replication worker) in this process, "
           "tuned by the autorecovery options (--lost-bookie-delay, ...)", False, parse_bool),
) + SERVER_AUTH + RECOVERY_TUNING, checks=(_water_marks, _message_size))

AUTORECOVERY = Process("autorecovery", COMMON + (EVENT_LOOP,
    dataclasses.replace(METADATA_URI, required=True),
    Option("http_port", "serve /api/v1/autorecovery/* and /metrics on this port (0: no HTTP)", 0, Number(int, 0),
           env="PYBK_RECOVERY_HTTP_PORT"),
    Option("http_host", "address to bind the admin HTTP server to", "127.0.0.1", env="PYBK_RECOVERY_HTTP_HOST"),
    Option("name", "this process's name in the auditor election (default host:pid)", env="PYBK_RECOVERY_NAME"),
    Option("no_worker", "only campaign for the auditor; do not replicate", False, parse_bool,
           env="PYBK_RECOVERY_NO_WORKER"),
) + SERVER_AUTH + RECOVERY_TUNING)

OPERATOR = Process("operator", COMMON + (
    Option("namespace", "watch only this namespace; default: every namespace", repeatable=True, metavar="NS",
           short="-n", env="PYBK_OPERATOR_NAMESPACES"),
    Option("default_metadata_uri", "metadata service (etcd://host:port/prefix) for clusters whose "
           "spec.metadataServiceUri is empty, e.g. the chart's bundled etcd", metavar="URI"),
    Option("refresh_interval", "how often each cluster's status is refreshed from etcd and the next step of a "
           "scale-down or rolling restart is taken", 20.0, Number(float, 0), metavar="SECONDS",
           env="PYBK_OPERATOR_REFRESH_INTERVAL"),
    Option("audit_interval", "how often the operator asks autorecovery for a full ledger audit", 3600.0,
           Number(float, 0), metavar="SECONDS", env="PYBK_OPERATOR_AUDIT_INTERVAL"),
    Option("liveness", "where kopf serves its liveness probe", "http://0.0.0.0:8080/healthz", metavar="URL",
           env="PYBK_OPERATOR_LIVENESS"),
    Option("verbose", "debug logging (as --log-level DEBUG)", False, parse_bool, short="-v",
           env="PYBK_OPERATOR_VERBOSE"),
))

PROCESSES = (BOOKIE, AUTORECOVERY, OPERATOR)

# `PYBK_*` variables that code other than these processes' options reads; every process lets them be.
ELSEWHERE: dict[str, str] = {
    "PYBK_METADATA_URI": "`pybk shell`'s default cluster (an option of the bookie and autorecovery too)",
    "PYBK_LOCAL_DIR": "`pybk local` and `pybk shell`: the default local cluster's data dir",
    "PYBK_CRD": "the operator's CRD file (the image sets it for every process)",
    "PYBK_SERVICE": "the bookie image's entrypoint: the headless Service in the bookie id",
    "PYBK_ZONE_WAIT": "the bookie image's entrypoint: seconds to wait for the node's zone",
    "PYBK_SPARK_DRY_RUN": "the Spark image's entrypoint: 1 prints the driver or executor command instead of running it",
    "PYBK_E2E_IMAGE": "the Kubernetes end-to-end tests: the image under test",
    "PYBK_E2E_SPARK_IMAGE": "the Kubernetes end-to-end tests: the Spark image under test",
    "PYBK_IMAGE_CACHE": "make image-test: where the bootstrapped base image's root is kept (default /var/cache/pybk-image)",
    "PYBK_DURABILITY_ROUNDS": "the durability test: rounds to run",
    "PYBK_DURABILITY_SEED": "the durability test: its random seed",
    "PYBK_LOG_RETENTION_INTERVAL": "the elected autorecovery process: seconds between passes of named logs' "
                                   "retention (default 60; 0 disables)",
    "PYBK_SPARK_JAR": "Spark sessions (pybk.spark.session): a prebuilt pybk Spark jar (the JVM log reader) to use "
                      "instead of building one (the Spark image sets it)",
    "PYBK_CACHE_DIR": "where pybk keeps what it builds: its Spark jar (default $XDG_CACHE_HOME/pybk or ~/.cache/pybk)",
    "PYBK_LOG_METRICS_MAX_LOGS": "any process using named logs: logs given a `log` label of their own in its "
                                 "metrics (default 100; later ones share `_other`)",
}


# ---------------------------------------------------------------------------------------------
# Typed settings: the options dataclasses components take, filled from the table.

T = TypeVar("T")
_OPTION = "pybk.option"  # the metadata key of an options dataclass field: the option that sets it


def _declared(name: str, process: Process | None) -> Option:
    """The option `name` of `process`, or of every process that declares it alike."""
    found = [o for p in ((process,) if process else PROCESSES) for o in p.options if o.name == name]
    if not found:
        raise LookupError(f"no option {name!r} in {process.title if process else 'any pybk process'}")
    if len({repr(o.default) for o in found}) > 1:
        raise LookupError(f"option {name!r} has other defaults in other processes: name the process")
    return found[0]


def _frozen(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def option_field(name: str, process: Process | None = None) -> Any:
    """A field of an options dataclass that option `name` sets, its default the table's (the one
    place defaults are declared). `process` is needed only where processes declare `name` with
    other defaults (http_port)."""
    return dataclasses.field(default=_frozen(_declared(name, process).value_in({})), metadata={_OPTION: name})


def build(cls: type[T], values: Mapping[str, Any], used: set[str] | None = None) -> T:
    """An options dataclass from resolved settings by option name: a field made by option_field
    takes its option's value, a field whose type is an options dataclass is built alike, any other
    keeps its default. The names of the options taken are added to `used`."""
    hints = get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        name = f.metadata.get(_OPTION)
        if name is not None:
            kwargs[f.name] = _frozen(values[name])
            if used is not None:
                used.add(name)
        elif isinstance(hints.get(f.name), type) and dataclasses.is_dataclass(hints[f.name]):
            kwargs[f.name] = build(hints[f.name], values, used)
    return cls(**kwargs)


def effective(*objects: Any) -> dict[str, Any]:
    """The values of live options objects by option name (nested ones included): what the
    components were really given, for the admin API and the tests. A secret option's values
    are each shown as "(set)"."""
    secrets = {o.name for p in PROCESSES for o in p.options if o.secret}
    out: dict[str, Any] = {}
    for obj in objects:
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            name = f.metadata.get(_OPTION)
            if name in secrets:
                out[name] = ["(set)"] * len(value or ()) if isinstance(value, tuple) or value is None else "(set)"
            elif name is not None:
                out[name] = list(value) if isinstance(value, tuple) else value
            elif dataclasses.is_dataclass(value) and not isinstance(value, type):
                out.update(effective(value))
    return out


@dataclass(frozen=True)
class Common:
    """What every process takes for itself: the settings file it read and how it logs."""

    config: str | None = option_field("config")
    log_level: str = option_field("log_level")
    log_format: LogFormat = option_field("log_format")


# ---------------------------------------------------------------------------------------------
# The loader.

def add_options(parser: argparse.ArgumentParser, process: Process) -> None:
    """Add every option of process to parser (defaults are applied later, by resolve)."""
    for opt in process.options:
        names = [opt.short, opt.flag] if opt.short else [opt.flag]
        default = f" (default: {_shown(opt.default)})" if opt.default not in (None, [], "") else ""
        if opt.repeatable:
            parser.add_argument(*names, dest=opt.name, action="append", default=None, metavar=opt.metavar,
                                help=f"{opt.help}; repeatable; env {opt.variable} (comma-separated){default}")
        elif opt.type is parse_bool:  # `--flag` alone means true; `--flag false` still works
            parser.add_argument(*names, dest=opt.name, default=None, nargs="?", const="true",
                                metavar=opt.metavar or "BOOL", help=f"{opt.help}; env {opt.variable}{default}")
        else:
            parser.add_argument(*names, dest=opt.name, default=None, metavar=opt.metavar,
                                help=f"{opt.help}; env {opt.variable}{default}")


def resolve(args: argparse.Namespace, process: Process, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Settings by option name, merged flag > environment > YAML file > default, converted by type.

    Raises ConfigError for a `PYBK_*` variable the process does not know or cannot parse (even one a
    flag overrides), a malformed flag or file value, a missing required setting or a failed check."""
    environ = os.environ if environ is None else environ
    from_env = environment(process, environ)
    path = getattr(args, CONFIG.name, None) or from_env.get(CONFIG.name)
    from_file = _read_file(path, process) if path else {}
    out: dict[str, Any] = {}
    for opt in process.options:
        flag = getattr(args, opt.name, None)
        if flag is not None:
            out[opt.name] = _convert(opt, flag, opt.flag)
        elif opt.name in from_env:
            out[opt.name] = from_env[opt.name]
        elif opt.name in from_file:
            out[opt.name] = _convert(opt, from_file[opt.name], f"{path}: {opt.name}")
        elif opt.required:
            raise ConfigError(f"missing setting {opt.name}: pass {opt.flag}, set {opt.variable}, "
                              f"or put {opt.name} in the --config file")
        else:
            out[opt.name] = opt.value_in({})
    for check in process.checks:
        problem = check(out)
        if problem:
            raise ConfigError(problem)
    return out


def settings(cls: type[T], args: argparse.Namespace, process: Process,
             environ: Mapping[str, str] | None = None) -> T:
    """The process's frozen settings object (cls) from its resolved settings. A settings class
    that leaves an option of the process unused is a programming error (TypeError): every
    option must reach a component."""
    used: set[str] = set()
    out = build(cls, resolve(args, process, environ), used)
    unused = [o.name for o in process.options if o.name not in used]
    if unused:
        raise TypeError(f"{cls.__name__} leaves options of {process.title} unused: {', '.join(unused)}")
    return out


def load(cls: type[T], args: argparse.Namespace, process: Process) -> T | None:
    """A process's start: its settings object (cls, which has a `common: Common`) with logging
    set up at their level and format, or None after printing `pybk NAME: <what is wrong>` (the caller exits 2)."""
    try:
        out = settings(cls, args, process)
    except ConfigError as exc:
        print(f"pybk {process.command}: {exc}", file=sys.stderr)
        return None
    common: Common = out.common  # type: ignore[attr-defined]
    level = "DEBUG" if getattr(out, "verbose", False) else common.log_level
    logformat.configure(level, common.log_format)
    for variable, owners in others_settings(process, os.environ).items():
        log.debug("%s left alone: a setting of %s, not of %s", variable, ", ".join(owners), process.title)
    return out


def environment(process: Process, environ: Mapping[str, str]) -> dict[str, Any]:
    """The process's settings found in `PYBK_*` variables, converted; ConfigError naming the first
    variable that no pybk process takes (a typo) or that is malformed. A setting of another pybk
    process is left to that one: `pybk local` hands one environment to all its children."""
    by_variable = {o.variable: o for o in process.options}
    out: dict[str, Any] = {}
    for variable in sorted(v for v in environ if v.startswith(ENV_PREFIX)):
        opt = by_variable.get(variable)
        if opt is None:
            if variable not in _known_variables():
                raise ConfigError(_unknown_variable(variable, process))
            continue
        out[opt.name] = opt.value_in(environ)
    return out


def _known_variables() -> set[str]:
    """Every `PYBK_*` name some pybk process or tool reads."""
    return {o.variable for p in PROCESSES for o in p.options} | set(ELSEWHERE)


def others_settings(process: Process, environ: Mapping[str, str]) -> dict[str, list[str]]:
    """The `PYBK_*` variables in environ that are settings of other pybk processes only, with the
    processes that take each."""
    mine = {o.variable for o in process.options}
    out: dict[str, list[str]] = {}
    for variable in sorted(v for v in environ if v.startswith(ENV_PREFIX) and v not in mine):
        owners = [p.title for p in PROCESSES if variable in {o.variable for o in p.options}]
        if owners:
            out[variable] = owners
    return out


def _unknown_variable(variable: str, process: Process) -> str:
    close = difflib.get_close_matches(variable, sorted(_known_variables()), n=1)
    hint = f"; did you mean {close[0]}?" if close else ""
    return f"{variable}: no pybk process takes this setting{hint}\nsee {process.title} --help"


def _convert(opt: Option, value: Any, source: str) -> Any:
    try:
        return opt.convert(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{source}: bad value for {opt.name}: {exc}") from None


def _read_file(path: str, process: Process) -> dict[str, Any]:
    """The YAML file's settings by option name (not yet converted)."""
    try:
        loaded = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {path} must hold a mapping of option names to values")
    known = {o.name for o in process.options if o is not CONFIG}
    out: dict[str, Any] = {}
    for k, v in loaded.items():
        key = str(k).replace("-", "_")
        if key not in known:
            raise ConfigError(f"config file {path}: unknown option {k!r} for {process.title}; "
                              f"known: {', '.join(sorted(known))}")
        out[key] = v
    return out


# ---------------------------------------------------------------------------------------------
# The reference.

def _shown(default: Any) -> str:
    if isinstance(default, bool):
        return str(default).lower()
    return "" if default is None else str(default)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def reference() -> str:
    """docs/options.md: every option, grouped by the processes that take it."""
    groups: dict[tuple[str, ...], list[Option]] = {}
    for process in PROCESSES:
        for opt in process.options:
            owners = tuple(p.title for p in PROCESSES if any(o is opt for o in p.options))
            if opt not in groups.setdefault(owners, []):
                groups[owners].append(opt)
    lines = [
        "# Options of the pybk processes",
        "",
        "Generated from `pybk/config.py` by `python -m pybk.config`; do not edit by hand.",
        "",
        "Each option is a flag, a `PYBK_*` environment variable, or a key of the YAML file given by "
        "`--config` (the key is the option name; dashes may replace underscores). A flag overrides "
        "the environment, which overrides the file, which overrides the default. A repeatable option "
        "takes its flag several times, a comma-separated variable or a YAML list; a boolean flag alone "
        "means true. A process refuses to start, naming the variable, when a `PYBK_*` variable is no "
        "setting of any pybk process (a typo: the nearest name is suggested) or its own setting's value "
        "is malformed; a setting of another pybk process is left to that process (`pybk local` hands one "
        "environment to all its children). Sizes take units: "
        "4096, 64KiB, 16MiB, 1GB.",
    ]
    for owners, options in groups.items():
        lines += ["", f"## {', '.join(f'`{o}`' for o in owners)}", "",
                  "| Option (YAML key) | Flag | Environment | Type | Default | Description |",
                  "|---|---|---|---|---|---|"]
        for opt in options:
            flag = f"`{opt.short}`, `{opt.flag}`" if opt.short else f"`{opt.flag}`"
            default = "required" if opt.required else (f"`{_shown(opt.default)}`" if _shown(opt.default) else "")
            lines.append(f"| `{opt.name}` | {flag} | `{opt.variable}` | {opt.type_name} | {default} | "
                         f"{_cell(opt.help)} |")
    lines += ["", "## Variables read elsewhere", "",
              "Every process accepts these; other code reads them.", "",
              "| Environment | Read by |", "|---|---|"]
    lines += [f"| `{name}` | {_cell(use)} |" for name, use in ELSEWHERE.items()]
    return "\n".join(lines) + "\n"


def main() -> int:
    """Write docs/options.md."""
    REFERENCE.write_text(reference())
    print(f"wrote {REFERENCE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
