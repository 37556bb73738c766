"""Options of the `pybk` data source, parsed and checked before any work starts.

Spark hands options over as a case-insensitive map of strings. Everything here is pure: a bad
value raises `OptionError` naming the option, the value and what would be accepted, so a typo
fails at `load()`/`save()` instead of deep inside an executor.
"""
from __future__ import annotations

import enum
import re
import uuid
from dataclasses import dataclass, field
from typing import Mapping

from pybk.entry import DigestType
from pybk.security.settings import ENV, ClientSecurity

DEFAULT_ENTRIES_PER_PARTITION = 50_000  # measured: 2,500 -> 40,000 halves CPU per entry (per-task cost)

# the client credentials (file names; see docs/security.md), on the driver and every executor
SECURITY_OPTIONS = {
    "tls_ca": "CA bundle (PEM file) to verify the bookies with; turns TLS on",
    "tls_cert": "client certificate (PEM file) presented to the bookies",
    "tls_key": "its private key (PEM file)",
    "tls_server_name": "name expected in the bookies' certificates (default: the host dialled)",
    "token_file": "file holding the bearer token presented to the bookies",
}
assert set(SECURITY_OPTIONS) == set(ENV)

READ_OPTIONS = {
    "metadataserviceuri": "etcd://host:port[,host:port]/prefix of the cluster's metadata (required)",
    "ledgers": "ledger ids to read: '1,2,5-9', open-ended '10-', or 'all' (default 'all')",
    "startentry": "first entry id to read in every ledger, inclusive (default 0)",
    "endentry": "last entry id to read in every ledger, inclusive (default: the last readable)",
    "entriesperpartition": f"entries per Spark partition (default {DEFAULT_ENTRIES_PER_PARTITION})",
    "includemetadata": "true adds a ledger_metadata map<string,binary> column (custom metadata)",
    "password": "ledger password (UTF-8 text; default empty)",
    "maxentriespertrigger": "streaming: at most this many entries per micro-batch (default no limit)",
    "startingposition": "streaming: 'earliest' (default) or 'latest' for ledgers known at start",
    "path": "same as ledgers (so load('1,2') works)",
    **SECURITY_OPTIONS,
}

WRITE_OPTIONS = {
    "metadataserviceuri": READ_OPTIONS["metadataserviceuri"],
    "ensemblesize": "bookies per ledger, E (default 3)",
    "writequorum": "copies of each entry, Qw (default 2)",
    "ackquorum": "acks before an entry counts as written, Qa (default 2)",
    "digesttype": "'crc32c' (default) or 'mac'",
    "password": READ_OPTIONS["password"],
    "jobid": "id recorded in every written ledger's custom metadata (default: a new UUID; "
             "not for streams, whose micro-batches are jobs '<query id>.<batch id>')",
    "checkpointlocation": "streaming: Spark's checkpoint directory (Spark passes it on; the sink "
                          "does not use it)",
    "queryname": "streaming: the query's name (Spark passes it on; the sink does not use it)",
    "path": "ignored",
    **SECURITY_OPTIONS,
}

class OptionError(ValueError):
    """An option of the pybk data source is missing or malformed."""


@dataclass(frozen=True)
class LedgerSelection:
    """Which ledgers a query covers: every ledger, or a union of inclusive id ranges.

    A range's upper end may be None (open-ended, '10-'), so a stream also follows ledgers
    created later inside the selection.
    """

    ranges: tuple[tuple[int, int | None], ...] = ()
    all: bool = False

    def __contains__(self, ledger_id: int) -> bool:
        if self.all:
            return True
        return any(lo <= ledger_id and (hi is None or ledger_id <= hi) for lo, hi in self.ranges)

    @property
    def finite(self) -> bool:
        """True when the selection is an explicit, bounded set of ids."""
        return not self.all and all(hi is not None for _, hi in self.ranges)

    def ids(self) -> list[int]:
        """The explicit ids, sorted (only for a finite selection)."""
        if not self.finite:
            raise ValueError("selection is not finite")
        return sorted({i for lo, hi in self.ranges for i in range(lo, hi + 1)})

    def __str__(self) -> str:
        if self.all:
            return "all"
        return ",".join(str(lo) if lo == hi else f"{lo}-{'' if hi is None else hi}"
                        for lo, hi in self.ranges)


MAX_EXPLICIT_LEDGERS = 1_000_000
_RANGE = re.compile(r"^(\d+)(?:\s*-\s*(\d*))?$")


def parse_ledgers(text: str) -> LedgerSelection:
    """Parse '1,2,5-9', '10-' or 'all' into a LedgerSelection."""
    text = (text or "").strip()
    if text.lower() in ("all", "*"):
        return LedgerSelection(all=True)
    if not text:
        raise OptionError("option ledgers is empty: give ids and ranges such as '1,2,5-9', "
                          "an open range such as '10-', or 'all'")
    ranges: list[tuple[int, int | None]] = []
    for part in text.split(","):
        part = part.strip()
        m = _RANGE.match(part)
        if not m:
            raise OptionError(f"option ledgers: {part!r} is not a ledger id or range "
                              f"(in {text!r}; expected e.g. '1,2,5-9', '10-' or 'all')")
        lo = int(m.group(1))
        if m.group(2) is None:
            hi: int | None = lo
        elif m.group(2) == "":
            hi = None
        else:
            hi = int(m.group(2))
            if hi < lo:
                raise OptionError(f"option ledgers: range {part!r} ends before it starts "
                                  f"(write it as '{hi}-{lo}')")
        ranges.append((lo, hi))
    selection = LedgerSelection(ranges=tuple(ranges))
    if selection.finite and sum(hi - lo + 1 for lo, hi in ranges) > MAX_EXPLICIT_LEDGERS:
        raise OptionError(f"option ledgers: {text!r} names more than {MAX_EXPLICIT_LEDGERS} ids; "
                          "use an open range such as '10-' or 'all'")
    return selection


def parse_bool(name: str, value: str | None, default: bool) -> bool:
    if value is None:
        return default
    v = str(value).strip().lower()
    if v in ("true", "1", "yes"):
        return True
    if v in ("false", "0", "no"):
        return False
    raise OptionError(f"option {name}: {value!r} is not a boolean (use true or false)")


def parse_int(name: str, value: str | None, default: int | None, minimum: int) -> int | None:
    if value is None or str(value).strip() == "":
        return default
    try:
        n = int(str(value).strip())
    except ValueError:
        raise OptionError(f"option {name}: {value!r} is not an integer") from None
    if n < minimum:
        raise OptionError(f"option {name}: {n} is below the minimum {minimum}")
    return n


def _check_uri(options: Mapping[str, str]) -> str:
    uri = options.get("metadataserviceuri")
    if not uri:
        raise OptionError("option metadataServiceUri is required, "
                          "e.g. .option('metadataServiceUri', 'etcd://127.0.0.1:2379/pybk')")
    if not str(uri).startswith("etcd://"):
        raise OptionError(f"option metadataServiceUri: {uri!r} must look like etcd://host:port/prefix")
    return str(uri)


def _check_known(options: Mapping[str, str], known: Mapping[str, str], what: str) -> None:
    unknown = sorted(k for k in (str(k).lower() for k in options.keys()) if k not in known)
    if unknown:
        raise OptionError(f"unknown option(s) for {what}: {', '.join(unknown)}; known options: "
                          + ", ".join(sorted(known)))


def parse_security(options: Mapping[str, str]) -> ClientSecurity | None:
    """The credentials given as options (lower-cased names), or None when none is given (then the
    local cluster's local.json, else the executors' credential variables, `PYBK_TLS_CA`,
    `PYBK_TOKEN_FILE`, ..., apply)."""
    given = {k: str(v).strip() for k, v in options.items() if k in SECURITY_OPTIONS and str(v).strip()}
    if "tls_cert" in given and "tls_key" not in given or "tls_key" in given and "tls_cert" not in given:
        raise OptionError("options tls_cert and tls_key go together: give both or neither")
    return ClientSecurity.from_mapping(given) if given else None


class StartingPosition(enum.StrEnum):
    """Where a stream with no checkpoint starts in each ledger: its first entry or its end."""
    EARLIEST = "earliest"
    LATEST = "latest"


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): v for k, v in options.items()}


@dataclass(frozen=True)
class ReadOptions:
    """Options of spark.read / spark.readStream .format('pybk')."""

    metadata_uri: str
    ledgers: LedgerSelection
    start_entry: int = 0
    end_entry: int | None = None
    entries_per_partition: int = DEFAULT_ENTRIES_PER_PARTITION
    include_metadata: bool = False
    password: bytes = b""
    max_entries_per_trigger: int | None = None
    starting_position: StartingPosition = StartingPosition.EARLIEST
    security: ClientSecurity | None = None

    def password_for(self, ledger_id: int) -> bytes:
        """The password to open this ledger with."""
        return self.password

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> "ReadOptions":
        opts = _lower(options)
        _check_known(opts, READ_OPTIONS, "reading format('pybk')")
        uri = _check_uri(opts)
        ledgers_text = opts.get("ledgers") or opts.get("path") or "all"
        start = parse_int("startEntry", opts.get("startentry"), 0, 0)
        end = parse_int("endEntry", opts.get("endentry"), None, 0)
        if end is not None and end < start:
            raise OptionError(f"option endEntry ({end}) is before startEntry ({start})")
        position = str(opts.get("startingposition", StartingPosition.EARLIEST)).strip().lower()
        try:
            starting_position = StartingPosition(position)
        except ValueError:
            raise OptionError(f"option startingPosition: {position!r} must be 'earliest' or 'latest'") from None
        return cls(
            metadata_uri=uri,
            ledgers=parse_ledgers(ledgers_text),
            start_entry=start,
            end_entry=end,
            entries_per_partition=parse_int("entriesPerPartition", opts.get("entriesperpartition"),
                                            DEFAULT_ENTRIES_PER_PARTITION, 1),
            include_metadata=parse_bool("includeMetadata", opts.get("includemetadata"), False),
            password=str(opts.get("password", "")).encode("utf-8"),
            max_entries_per_trigger=parse_int("maxEntriesPerTrigger",
                                              opts.get("maxentriespertrigger"), None, 1),
            starting_position=starting_position,
            security=parse_security(opts),
        )


@dataclass(frozen=True)
class WriteOptions:
    """Options of df.write.format('pybk')."""

    metadata_uri: str
    ensemble_size: int = 3
    write_quorum: int = 2
    ack_quorum: int = 2
    digest_type: DigestType = DigestType.CRC32C
    password: bytes = b""
    job_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    security: ClientSecurity | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> "WriteOptions":
        opts = _lower(options)
        _check_known(opts, WRITE_OPTIONS, "writing format('pybk')")
        uri = _check_uri(opts)
        e = parse_int("ensembleSize", opts.get("ensemblesize"), 3, 1)
        qw = parse_int("writeQuorum", opts.get("writequorum"), min(2, e), 1)
        qa = parse_int("ackQuorum", opts.get("ackquorum"), min(2, qw), 1)
        if not e >= qw >= qa:
            raise OptionError(f"need ensembleSize >= writeQuorum >= ackQuorum >= 1, got "
                              f"E={e} Qw={qw} Qa={qa}")
        digest_name = str(opts.get("digesttype", "crc32c")).strip().upper()
        try:
            digest = DigestType[digest_name]
        except KeyError:
            raise OptionError(f"option digestType: {digest_name.lower()!r} must be one of "
                              + ", ".join(d.name.lower() for d in DigestType)) from None
        job_id = str(opts.get("jobid") or uuid.uuid4().hex)
        return cls(metadata_uri=uri, ensemble_size=e, write_quorum=qw, ack_quorum=qa,
                   digest_type=digest, password=str(opts.get("password", "")).encode("utf-8"),
                   job_id=job_id, security=parse_security(opts))
