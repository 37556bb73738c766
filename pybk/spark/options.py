"""Options of the `pybk` data source, parsed and checked before any work starts.

Spark hands options over as a case-insensitive map of strings. Everything here is pure: a bad
value raises `OptionError` naming the option, the value and what would be accepted, so a typo
fails at `load()`/`save()` instead of deep inside an executor.
"""
from __future__ import annotations

import enum
import json
import re
import uuid
from dataclasses import dataclass, field, replace
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
    "ledgers": "ledgers to read: ids '1,2,5-9', open-ended '10-', 'all' (default), and/or custom-metadata "
               "selectors 'metadata.KEY=VALUE' (same key repeated: any of the values; different keys "
               "and ids: all must hold)",
    "startentry": "first entry id to read in every ledger, inclusive (default 0); not with startingOffsets",
    "endentry": "last entry id to read in every ledger, inclusive (default: the last readable); "
                "not with endingOffsets",
    "startingoffsets": "'earliest' (default), 'latest', or JSON {\"<ledger id>\": first entry, ...} "
                       "(-2 earliest, -1 latest); ledgers not named start at earliest",
    "endingoffsets": "'latest' (default) or JSON {\"<ledger id>\": entry id to stop before, ...} "
                     "(-1 latest); ledgers not named end at latest",
    "entriesperpartition": f"entries per Spark partition (default {DEFAULT_ENTRIES_PER_PARTITION})",
    "minpartitions": "at least this many Spark partitions per scan or micro-batch when there are that "
                     "many entries (ranges are split further; default 1)",
    "includemetadata": "true adds the ledgers' custom metadata: ledger_metadata map<string,binary> and "
                       "ledger_properties map<string,string> (the values that are UTF-8)",
    "password": "ledger password (UTF-8 text; default empty)",
    "passwords": "JSON {\"<ledger id>\" or \"metadata.KEY=VALUE\": password, ...}: per-ledger passwords "
                 "(an id wins over selectors, selectors in the order given, then option password)",
    "onunauthorized": "'fail' (default: the error names the ledger) or 'skip' (ledgers the passwords "
                      "do not open are left out, with a warning and a count)",
    "failondataloss": "true (default): a ledger deleted or shortened under a running query fails it; "
                      "false: skip what is lost, with a warning",
    "maxentriespertrigger": "streaming: at most this many entries per micro-batch (default no limit)",
    "startingposition": "streaming: 'earliest' or 'latest', the same as startingOffsets' words",
    "path": "same as ledgers (so load('1,2') works)",
    **SECURITY_OPTIONS,
}

WRITE_OPTIONS = {
    "metadataserviceuri": READ_OPTIONS["metadataserviceuri"],
    "ensemblesize": "bookies per ledger, E (default: the cluster's ledger defaults, else 3)",
    "writequorum": "copies of each entry, Qw (default: the cluster's, else 2; at most E)",
    "ackquorum": "acks before an entry counts as written, Qa (default: the cluster's, else 2; at most Qw)",
    "digesttype": "'crc32c' (default) or 'mac'",
    "password": "ledger password (UTF-8 text); required with security on (TLS or credentials), else "
                "default empty",
    "jobid": "the write job's id: its record and every written ledger's custom metadata name it; "
             "1-200 letters, digits, '.', '_', '-', used once (default: a new UUID; not for streams, "
             "whose micro-batches are jobs '<query id>.<batch id>')",
    "checkpointlocation": "streaming: Spark's checkpoint directory (Spark passes it on; the sink "
                          "does not use it)",
    "queryname": "streaming: the query's name (Spark passes it on; the sink does not use it)",
    "path": "ignored",
    **SECURITY_OPTIONS,
}


class OptionError(ValueError):
    """An option of the pybk data source is missing or malformed."""


METADATA_PREFIX = "metadata."


@dataclass(frozen=True)
class Selector:
    """`metadata.KEY=VALUE`: ledgers whose custom metadata KEY holds VALUE (compared as UTF-8 bytes)."""

    key: str
    value: str

    def matches(self, custom: Mapping[str, bytes]) -> bool:
        got = custom.get(self.key)
        return got is not None and bytes(got) == self.value.encode("utf-8")

    def __str__(self) -> str:
        return f"{METADATA_PREFIX}{self.key}={self.value}"


def parse_selector(text: str, option: str) -> Selector | None:
    """`metadata.KEY=VALUE` as a Selector; None when text is not a selector at all."""
    text = text.strip()
    if not text.lower().startswith(METADATA_PREFIX):
        return None
    key, eq, value = text[len(METADATA_PREFIX):].partition("=")
    if not eq or not key.strip():
        raise OptionError(f"option {option}: {text!r} is not a metadata selector "
                          "(expected metadata.KEY=VALUE, e.g. metadata.stream=orders)")
    return Selector(key.strip(), value.strip())


@dataclass(frozen=True)
class LedgerSelection:
    """Which ledgers a query covers: every ledger or a union of inclusive id ranges, and of those
    the ones whose custom metadata matches the selectors.

    A range's upper end may be None (open-ended, '10-'), so a stream also follows ledgers
    created later inside the selection. Selectors of one key are alternatives (any value matches);
    selectors of different keys must all match, like the ids.
    """

    ranges: tuple[tuple[int, int | None], ...] = ()
    all: bool = False
    selectors: tuple[Selector, ...] = ()

    def __contains__(self, ledger_id: int) -> bool:
        if self.all:
            return True
        return any(lo <= ledger_id and (hi is None or ledger_id <= hi) for lo, hi in self.ranges)

    def matches(self, custom: Mapping[str, bytes]) -> bool:
        """Whether a ledger's custom metadata satisfies the selectors (always, without any)."""
        keys = {s.key for s in self.selectors}
        return all(any(s.matches(custom) for s in self.selectors if s.key == k) for k in keys)

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
        ids = "all" if self.all else ",".join(
            str(lo) if lo == hi else f"{lo}-{'' if hi is None else hi}" for lo, hi in self.ranges)
        if not self.selectors:
            return ids
        return ",".join(([] if self.all else [ids]) + [str(s) for s in self.selectors])


MAX_EXPLICIT_LEDGERS = 1_000_000
_RANGE = re.compile(r"^(\d+)(?:\s*-\s*(\d*))?$")


def parse_ledgers(text: str) -> LedgerSelection:
    """Parse '1,2,5-9', '10-', 'all' and 'metadata.KEY=VALUE' items into a LedgerSelection."""
    text = (text or "").strip()
    if text.lower() in ("all", "*"):
        return LedgerSelection(all=True)
    if not text:
        raise OptionError("option ledgers is empty: give ids and ranges such as '1,2,5-9', "
                          "an open range such as '10-', 'all', or selectors such as metadata.stream=orders")
    ranges: list[tuple[int, int | None]] = []
    selectors: list[Selector] = []
    every = False
    for part in text.split(","):
        part = part.strip()
        selector = parse_selector(part, "ledgers")
        if selector is not None:
            selectors.append(selector)
            continue
        if part.lower() in ("all", "*"):
            every = True
            continue
        m = _RANGE.match(part)
        if not m:
            raise OptionError(f"option ledgers: {part!r} is not a ledger id, range or selector "
                              f"(in {text!r}; expected e.g. '1,2,5-9', '10-', 'all' or metadata.stream=orders)")
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
    every = every or not ranges
    selection = LedgerSelection(ranges=() if every else tuple(ranges), all=every, selectors=tuple(selectors))
    if selection.finite and sum(hi - lo + 1 for lo, hi in ranges) > MAX_EXPLICIT_LEDGERS:
        raise OptionError(f"option ledgers: {text!r} names more than {MAX_EXPLICIT_LEDGERS} ids; "
                          "use an open range such as '10-' or 'all'")
    return selection


EARLIEST = -2
LATEST = -1
_POSITION_WORDS = {"earliest": EARLIEST, "latest": LATEST}


@dataclass(frozen=True)
class Positions:
    """Per-ledger entry positions (startingOffsets / endingOffsets): an entry id, EARLIEST (-2) or
    LATEST (-1) for each named ledger, and a default for every other ledger."""

    default: int = EARLIEST
    ledgers: tuple[tuple[int, int], ...] = ()

    def of(self, ledger_id: int) -> int:
        """This ledger's position as given (an entry id, EARLIEST or LATEST)."""
        return dict(self.ledgers).get(ledger_id, self.default)

    def resolve(self, ledger_id: int, next_readable: int) -> int:
        """This ledger's position as an entry id, given the next entry not yet readable."""
        p = self.of(ledger_id)
        return 0 if p == EARLIEST else next_readable if p == LATEST else p

    def first_of_new(self, ledger_id: int) -> int:
        """Where a stream starts in a ledger found after it started: everything in it is new, so
        earliest unless an entry id is given."""
        p = self.of(ledger_id)
        return p if p >= 0 else 0

    def cap(self, ledger_id: int) -> int | None:
        """As an ending position: the entry to stop before, or None (latest: no cap)."""
        p = self.of(ledger_id)
        return None if p == LATEST else p


def parse_positions(name: str, text: str | None, default: int) -> Positions | None:
    """'earliest', 'latest' or JSON {"<ledger id>": position} (-2 earliest, -1 latest); None if unset."""
    if text is None or not str(text).strip():
        return None
    text = str(text).strip()
    if text.lower() in _POSITION_WORDS:
        return Positions(default=_POSITION_WORDS[text.lower()])
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise OptionError(f"option {name}: {text!r} is not 'earliest', 'latest' or JSON such as "
                          f'{{"12": 100, "13": -2}} ({exc})') from None
    if not isinstance(data, dict):
        raise OptionError(f"option {name}: {text!r} must be a JSON object "
                          '{"<ledger id>": <entry id, -2 earliest or -1 latest>}')
    out: list[tuple[int, int]] = []
    for k, v in data.items():
        try:
            lid = int(k)
            ok = lid >= 0 and isinstance(v, int) and not isinstance(v, bool) and v >= EARLIEST
        except ValueError:
            ok = False
        if not ok:
            raise OptionError(f"option {name}: {k!r}: {v!r} in {text!r} is not "
                              "\"<ledger id>\": <entry id, -2 earliest or -1 latest>")
        out.append((lid, v))
    return Positions(default=default, ledgers=tuple(sorted(out)))


class OnUnauthorized(enum.StrEnum):
    """What a read does with a ledger its passwords do not open."""
    FAIL = "fail"
    SKIP = "skip"


def parse_passwords(text: str | None) -> tuple[tuple[tuple[int, bytes], ...], tuple[tuple[Selector, bytes], ...]]:
    """JSON {"<ledger id>" or "metadata.KEY=VALUE": password} into (by id, by selector)."""
    if text is None or not str(text).strip():
        return (), ()
    try:
        data = json.loads(str(text))
    except ValueError as exc:
        raise OptionError(f"option passwords is not JSON such as "
                          f'{{"12": "pw", "metadata.team=a": "pw2"}} ({exc})') from None
    if not isinstance(data, dict):
        raise OptionError('option passwords must be a JSON object {"<ledger id> or metadata.KEY=VALUE": '
                          '"password"}')
    by_id: list[tuple[int, bytes]] = []
    by_selector: list[tuple[Selector, bytes]] = []
    for k, v in data.items():
        if not isinstance(v, str):
            raise OptionError(f"option passwords: the password of {k!r} must be a JSON string")
        selector = parse_selector(str(k), "passwords")
        if selector is not None:
            by_selector.append((selector, v.encode("utf-8")))
        elif str(k).strip().isdigit():
            by_id.append((int(k), v.encode("utf-8")))
        else:
            raise OptionError(f"option passwords: key {k!r} is neither a ledger id nor a selector "
                              "metadata.KEY=VALUE")
    return tuple(by_id), tuple(by_selector)


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


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): v for k, v in options.items()}


def _one_of(opts: Mapping[str, str], a: str, b: str) -> None:
    if opts.get(a.lower()) not in (None, "") and opts.get(b.lower()) not in (None, ""):
        raise OptionError(f"options {a} and {b} both say where reading starts or stops: give only one "
                          "(startEntry/endEntry: the same entry in every ledger; startingOffsets/"
                          "endingOffsets: per ledger)")


@dataclass(frozen=True)
class ReadOptions:
    """Options of spark.read / spark.readStream .format('pybk').

    starting / ending hold startingOffsets / endingOffsets (ending positions are exclusive: the
    first entry not read); startEntry N is starting default N, endEntry M is ending default M + 1,
    startingPosition is startingOffsets' words. `resolved` carries passwords resolved on the driver
    from ledger metadata (selectors in `passwords`) to the executors.
    """

    metadata_uri: str
    ledgers: LedgerSelection
    starting: Positions = Positions(EARLIEST)
    ending: Positions = Positions(LATEST)
    entries_per_partition: int = DEFAULT_ENTRIES_PER_PARTITION
    min_partitions: int = 1
    include_metadata: bool = False
    password: bytes = b""
    passwords: tuple[tuple[int, bytes], ...] = ()
    selector_passwords: tuple[tuple[Selector, bytes], ...] = ()
    on_unauthorized: OnUnauthorized = OnUnauthorized.FAIL
    fail_on_data_loss: bool = True
    max_entries_per_trigger: int | None = None
    security: ClientSecurity | None = None
    resolved: tuple[tuple[int, bytes], ...] = ()

    def password_for(self, ledger_id: int, custom: Mapping[str, bytes] | None = None) -> bytes:
        """The password to open this ledger with: resolved on the driver, else given for its id,
        else the first selector of `passwords` its custom metadata matches (when given), else
        option password."""
        for table in (self.resolved, self.passwords):
            for lid, pw in table:
                if lid == ledger_id:
                    return pw
        if custom is not None:
            for selector, pw in self.selector_passwords:
                if selector.matches(custom):
                    return pw
        return self.password

    def with_password(self, ledger_id: int, password: bytes) -> "ReadOptions":
        """These options with this ledger's password resolved (what password_for answers)."""
        return replace(self, resolved=((ledger_id, password),))

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> "ReadOptions":
        opts = _lower(options)
        _check_known(opts, READ_OPTIONS, "reading format('pybk')")
        uri = _check_uri(opts)
        ledgers_text = opts.get("ledgers") or opts.get("path") or "all"
        _one_of(opts, "startEntry", "startingOffsets")
        _one_of(opts, "startEntry", "startingPosition")
        _one_of(opts, "startingPosition", "startingOffsets")
        _one_of(opts, "endEntry", "endingOffsets")
        start = parse_int("startEntry", opts.get("startentry"), 0, 0)
        end = parse_int("endEntry", opts.get("endentry"), None, 0)
        if end is not None and end < start:
            raise OptionError(f"option endEntry ({end}) is before startEntry ({start})")
        position = opts.get("startingposition")
        if position is not None and str(position).strip().lower() not in _POSITION_WORDS:
            raise OptionError(f"option startingPosition: {position!r} must be 'earliest' or 'latest'")
        starting = (parse_positions("startingOffsets", opts.get("startingoffsets"), EARLIEST)
                    or parse_positions("startingPosition", position, EARLIEST)
                    or Positions(default=start if start else EARLIEST))
        ending = (parse_positions("endingOffsets", opts.get("endingoffsets"), LATEST)
                  or Positions(default=LATEST if end is None else end + 1))
        if ending.default == EARLIEST or any(p == EARLIEST for _, p in ending.ledgers):
            raise OptionError(f"option endingOffsets: {opts.get('endingoffsets')!r}: earliest (-2) "
                              "is not an ending position (use an entry id or -1, latest)")
        unauthorized = str(opts.get("onunauthorized", OnUnauthorized.FAIL)).strip().lower()
        try:
            on_unauthorized = OnUnauthorized(unauthorized)
        except ValueError:
            raise OptionError(f"option onUnauthorized: {unauthorized!r} must be 'fail' or 'skip'") from None
        by_id, by_selector = parse_passwords(opts.get("passwords"))
        return cls(
            metadata_uri=uri,
            ledgers=parse_ledgers(ledgers_text),
            starting=starting,
            ending=ending,
            entries_per_partition=parse_int("entriesPerPartition", opts.get("entriesperpartition"),
                                            DEFAULT_ENTRIES_PER_PARTITION, 1),
            min_partitions=parse_int("minPartitions", opts.get("minpartitions"), 1, 1),
            include_metadata=parse_bool("includeMetadata", opts.get("includemetadata"), False),
            password=str(opts.get("password", "")).encode("utf-8"),
            passwords=by_id,
            selector_passwords=by_selector,
            on_unauthorized=on_unauthorized,
            fail_on_data_loss=parse_bool("failOnDataLoss", opts.get("failondataloss"), True),
            max_entries_per_trigger=parse_int("maxEntriesPerTrigger",
                                              opts.get("maxentriespertrigger"), None, 1),
            security=parse_security(opts),
        )


FALLBACK_GEOMETRY = (3, 2, 2)  # E/Qw/Qa of writes when neither the options nor the cluster say


@dataclass(frozen=True)
class WriteOptions:
    """Options of df.write.format('pybk'). E/Qw/Qa left None take the cluster's stored ledger
    defaults (`geometry`), resolved once on the driver."""

    metadata_uri: str
    ensemble_size: int | None = None
    write_quorum: int | None = None
    ack_quorum: int | None = None
    digest_type: DigestType = DigestType.CRC32C
    password: bytes = b""
    job_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    security: ClientSecurity | None = None

    def geometry(self, defaults: tuple[int, int, int] | None) -> tuple[int, int, int]:
        """(E, Qw, Qa) of the ledgers to write: the options, the rest from `defaults` (the
        cluster's; None: FALLBACK_GEOMETRY), quorums capped by what the options set above them."""
        e0, qw0, qa0 = defaults or FALLBACK_GEOMETRY
        e = self.ensemble_size or e0
        qw = self.write_quorum or min(qw0, e)
        qa = self.ack_quorum or min(qa0, qw)
        if not e >= qw >= qa >= 1:
            raise OptionError(f"need ensembleSize >= writeQuorum >= ackQuorum >= 1, got E={e} Qw={qw} Qa={qa}"
                              + ("" if defaults is None else f" (cluster ledger defaults {e0}/{qw0}/{qa0})"))
        return e, qw, qa

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> "WriteOptions":
        from pybk.meta.errors import BadMetadataError
        from pybk.meta.jobs import check_job_id
        opts = _lower(options)
        _check_known(opts, WRITE_OPTIONS, "writing format('pybk')")
        uri = _check_uri(opts)
        e = parse_int("ensembleSize", opts.get("ensemblesize"), None, 1)
        qw = parse_int("writeQuorum", opts.get("writequorum"), None, 1)
        qa = parse_int("ackQuorum", opts.get("ackquorum"), None, 1)
        given = [v for v in (e, qw, qa) if v is not None]
        if given != sorted(given, reverse=True):  # contradictory options fail now, whatever the cluster's defaults
            raise OptionError("need ensembleSize >= writeQuorum >= ackQuorum >= 1, got "
                              f"E={e or '-'} Qw={qw or '-'} Qa={qa or '-'}")
        digest_name = str(opts.get("digesttype", "crc32c")).strip().upper()
        try:
            digest = DigestType[digest_name]
        except KeyError:
            raise OptionError(f"option digestType: {digest_name.lower()!r} must be one of "
                              + ", ".join(d.name.lower() for d in DigestType)) from None
        job_id = str(opts.get("jobid") or uuid.uuid4().hex)
        try:
            check_job_id(job_id)
        except BadMetadataError as exc:
            raise OptionError(f"option jobId: {exc}") from None
        return cls(metadata_uri=uri, ensemble_size=e, write_quorum=qw, ack_quorum=qa,
                   digest_type=digest, password=str(opts.get("password", "")).encode("utf-8"),
                   job_id=job_id, security=parse_security(opts))
