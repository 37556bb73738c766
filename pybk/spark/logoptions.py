"""Options of the `pybk` data source when it reads or writes named logs (`option("log", ...)`).

Pure parsing, like `options`: a bad value raises `OptionError` naming the option, the value and
what would be accepted, at `load()`/`save()`. Positions follow Kafka's source: `startingOffsets`
and `endingOffsets` are `earliest`, `latest` or JSON by log name (`{"orders": 1200}`, -2 earliest,
-1 latest), `startingTimestamp` / `startingOffsetsByTimestamp` start at the first record at or
after a time (ms).
"""
from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass
from typing import Mapping

from pybk.security.settings import ClientSecurity

from .options import (EARLIEST, LATEST, SECURITY_OPTIONS, OptionError, _check_known, _check_uri, _lower,
                      parse_bool, parse_int, parse_security)

# each task costs Spark and its Python worker a fixed time (local[2], 256 MiB log of 100-byte records, one
# session: 32 -> 64 MiB cut the scan by a fifth, 128 MiB a little more but left one core idle at the end)
DEFAULT_BYTES_PER_PARTITION = 64 << 20
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$")
_WORDS = {"earliest": EARLIEST, "latest": LATEST}

LOG_READ_OPTIONS = {
    "metadataserviceuri": "etcd://host:port[,host:port]/prefix of the cluster's metadata (required)",
    "log": "logs to read: names, comma-separated, and/or patterns such as 'orders.*' (a regular "
           "expression matched against whole names)",
    "startingoffsets": "'earliest' (default), 'latest', or JSON {\"<log>\": offset, ...} (-2 earliest, "
                       "-1 latest); logs not named start at earliest",
    "endingoffsets": "'latest' (default) or JSON {\"<log>\": offset to stop before, ...} (-1 latest)",
    "startingtimestamp": "start every log at its first record with a timestamp >= this (ms since the epoch)",
    "startingoffsetsbytimestamp": "JSON {\"<log>\": ms, ...}: start each named log at its first record "
                                  "at or after that time",
    "failondataloss": "true (default): a query whose next offset was truncated away fails, naming the "
                      "log, the offset and the log's start offset; false: skip to the start, with a "
                      "warning and a count",
    "maxrecordspertrigger": "streaming: at most this many records per micro-batch, shared fairly "
                            "between logs (default no limit)",
    "minpartitions": "at least this many Spark partitions per scan or micro-batch (default 1)",
    "bytesperpartition": f"bytes of entries per Spark partition (default {DEFAULT_BYTES_PER_PARTITION})",
    "cursor": "streaming: commit the query's progress (the next offset of each log) to this durable "
              "cursor after every micro-batch, so `interest` retention keeps what it has not read; "
              "a query without a checkpoint and without startingOffsets starts from it",
    "includeproducer": "'auto' (default: when a log read was written by an idempotent producer), "
                       "'true' or 'false': add the columns producer_id and sequence",
    "password": "the logs' password: needed only for MAC-signed logs (CRC32C logs need none)",
    "passwords": "JSON {\"<log>\": password, ...}: passwords by log name",
    "path": "same as log",
    "reader": "batch scans: 'auto' (default: pybk's JVM reader when its jar is on Spark's classpath, as "
              "pybk.spark.session.local_session puts it; else the Python data source) or 'python' (the "
              "Python data source always)",
    **SECURITY_OPTIONS,
}

LOG_WRITE_OPTIONS = {
    "metadataserviceuri": LOG_READ_OPTIONS["metadataserviceuri"],
    "log": "the log to append to (it must exist)",
    "password": "the log's password (UTF-8 text)",
    "jobid": "batch writes: the write job's id (default a new UUID); running a job that died in its "
             "commit again with the same jobId appends exactly what is missing",
    "checkpointlocation": "streaming: Spark's checkpoint directory (Spark passes it on)",
    "queryname": "streaming: the query's name (Spark passes it on)",
    "path": "same as log",
    **SECURITY_OPTIONS,
}


def is_log_options(options: Mapping[str, str]) -> bool:
    """True when the options address logs (option log), not ledgers."""
    return any(str(k).lower() == "log" for k in options)


class ScanReader(enum.Enum):
    """Who reads a batch scan's partitions: pybk's JVM reader when Spark has it, or Python."""

    AUTO = "auto"
    PYTHON = "python"


@dataclass(frozen=True)
class LogSelection:
    """Which logs a query covers: exact names and patterns (regular expressions over whole names)."""

    names: tuple[str, ...] = ()
    patterns: tuple[str, ...] = ()

    def matches(self, name: str) -> bool:
        return name in self.names or any(re.fullmatch(p, name) for p in self.patterns)

    def __str__(self) -> str:
        return ",".join(self.names + self.patterns)


def parse_logs(text: str | None, option: str = "log") -> LogSelection:
    """'orders,refunds,audit.*' into names and patterns; an item that is not a valid log name is a
    pattern, which must compile."""
    items = [t.strip() for t in str(text or "").split(",") if t.strip()]
    if not items:
        raise OptionError(f"option {option} is empty: give log names such as 'orders' or patterns such as "
                          "'orders.*'")
    names, patterns = [], []
    for item in items:
        if _NAME.match(item) and not any(c in item for c in "*?+[]()|^$\\{}"):
            names.append(item)
            continue
        try:
            re.compile(item)
        except re.error as exc:
            raise OptionError(f"option {option}: {item!r} is neither a log name nor a valid pattern ({exc})") \
                from None
        patterns.append(item)
    return LogSelection(tuple(names), tuple(patterns))


@dataclass(frozen=True)
class LogPositions:
    """A per-log position: an offset, EARLIEST (-2) or LATEST (-1) for named logs, a default for
    the others."""

    default: int = EARLIEST
    logs: tuple[tuple[str, int], ...] = ()

    def of(self, log: str) -> int:
        return dict(self.logs).get(log, self.default)


def parse_log_positions(name: str, text: str | None, default: int) -> LogPositions | None:
    """'earliest', 'latest' or JSON {"<log>": offset} (-2 earliest, -1 latest); None if unset."""
    if text is None or not str(text).strip():
        return None
    text = str(text).strip()
    if text.lower() in _WORDS:
        return LogPositions(default=_WORDS[text.lower()])
    data = _json_object(name, text, '{"orders": 1200}')
    out = []
    for k, v in data.items():
        if not (isinstance(v, int) and not isinstance(v, bool) and v >= EARLIEST):
            raise OptionError(f"option {name}: {k!r}: {v!r} in {text!r} is not an offset (or -2 earliest, "
                              "-1 latest)")
        out.append((str(k), v))
    return LogPositions(default=default, logs=tuple(sorted(out)))


def parse_timestamps(text: str | None) -> tuple[tuple[str, int], ...]:
    """JSON {"<log>": ms} of startingOffsetsByTimestamp."""
    if text is None or not str(text).strip():
        return ()
    data = _json_object("startingOffsetsByTimestamp", str(text), '{"orders": 1764201600000}')
    out = []
    for k, v in data.items():
        if not (isinstance(v, int) and not isinstance(v, bool) and v >= 0):
            raise OptionError(f"option startingOffsetsByTimestamp: {k!r}: {v!r} is not a time in ms >= 0")
        out.append((str(k), v))
    return tuple(sorted(out))


def _json_object(name: str, text: str, example: str) -> dict:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise OptionError(f"option {name}: {text!r} is not JSON such as {example} ({exc})") from None
    if not isinstance(data, dict):
        raise OptionError(f"option {name}: {text!r} must be a JSON object such as {example}")
    return data


@dataclass(frozen=True)
class LogReadOptions:
    """Options of spark.read / spark.readStream .format('pybk') .option('log', ...)."""

    metadata_uri: str
    logs: LogSelection
    starting: LogPositions = LogPositions(EARLIEST)
    starting_given: bool = False
    ending: LogPositions = LogPositions(LATEST)
    starting_timestamp: int | None = None
    timestamps: tuple[tuple[str, int], ...] = ()
    fail_on_data_loss: bool = True
    max_records_per_trigger: int | None = None
    min_partitions: int = 1
    bytes_per_partition: int = DEFAULT_BYTES_PER_PARTITION
    cursor: str | None = None
    include_producer: bool | None = None      # None: auto
    password: bytes = b""
    passwords: tuple[tuple[str, bytes], ...] = ()
    security: ClientSecurity | None = None
    reader: ScanReader = ScanReader.AUTO

    def password_for(self, log: str) -> bytes:
        return dict(self.passwords).get(log, self.password)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> "LogReadOptions":
        opts = _lower(options)
        _check_known(opts, LOG_READ_OPTIONS, "reading logs with format('pybk')")
        uri = _check_uri(opts)
        given = [k for k in ("startingoffsets", "startingtimestamp", "startingoffsetsbytimestamp")
                 if str(opts.get(k) or "").strip()]
        if len(given) > 1:
            raise OptionError(f"options {' and '.join(given)} both say where reading starts: give only one")
        starting = parse_log_positions("startingOffsets", opts.get("startingoffsets"), EARLIEST)
        ending = parse_log_positions("endingOffsets", opts.get("endingoffsets"), LATEST) or LogPositions(LATEST)
        if ending.default == EARLIEST or any(p == EARLIEST for _, p in ending.logs):
            raise OptionError(f"option endingOffsets: {opts.get('endingoffsets')!r}: earliest (-2) is not an "
                              "ending position (use an offset or -1, latest)")
        producer = str(opts.get("includeproducer", "auto")).strip().lower()
        if producer not in ("auto", "true", "false"):
            raise OptionError(f"option includeProducer: {producer!r} must be auto, true or false")
        cursor = str(opts.get("cursor") or "").strip() or None
        if cursor is not None and not _NAME.match(cursor):
            raise OptionError(f"option cursor: {cursor!r} is not a cursor name (letters, digits, '.', '_', '-', "
                              "'/', starting with a letter or digit)")
        passwords = _json_object("passwords", str(opts["passwords"]), '{"orders": "pw"}') \
            if str(opts.get("passwords") or "").strip() else {}
        if any(not isinstance(v, str) for v in passwords.values()):
            raise OptionError("option passwords: every password must be a JSON string")
        reader = str(opts.get("reader", "auto")).strip().lower()
        if reader not in {r.value for r in ScanReader}:
            raise OptionError(f"option reader: {reader!r} must be auto or python")
        return cls(
            metadata_uri=uri,
            logs=parse_logs(opts.get("log") or opts.get("path")),
            starting=starting or LogPositions(EARLIEST),
            starting_given=bool(given),
            ending=ending,
            starting_timestamp=parse_int("startingTimestamp", opts.get("startingtimestamp"), None, 0),
            timestamps=parse_timestamps(opts.get("startingoffsetsbytimestamp")),
            fail_on_data_loss=parse_bool("failOnDataLoss", opts.get("failondataloss"), True),
            max_records_per_trigger=parse_int("maxRecordsPerTrigger", opts.get("maxrecordspertrigger"), None, 1),
            min_partitions=parse_int("minPartitions", opts.get("minpartitions"), 1, 1),
            bytes_per_partition=parse_int("bytesPerPartition", opts.get("bytesperpartition"),
                                          DEFAULT_BYTES_PER_PARTITION, 1),
            cursor=cursor,
            include_producer=None if producer == "auto" else producer == "true",
            password=str(opts.get("password", "")).encode("utf-8"),
            passwords=tuple(sorted((str(k), v.encode("utf-8")) for k, v in passwords.items())),
            security=parse_security(opts),
            reader=ScanReader(reader),
        )


@dataclass(frozen=True)
class LogWriteOptions:
    """Options of df.write / df.writeStream .format('pybk') .option('log', ...)."""

    metadata_uri: str
    log: str
    password: bytes = b""
    job_id: str | None = None
    security: ClientSecurity | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> "LogWriteOptions":
        from pybk.meta.errors import BadMetadataError
        from pybk.meta.jobs import check_job_id
        opts = _lower(options)
        _check_known(opts, LOG_WRITE_OPTIONS, "writing logs with format('pybk')")
        uri = _check_uri(opts)
        name = str(opts.get("log") or opts.get("path") or "").strip()
        if not _NAME.match(name):
            raise OptionError(f"option log: {name!r} is not a log name (writes go to one log)")
        job_id = str(opts.get("jobid") or "").strip() or None
        if job_id is not None:
            try:
                check_job_id(job_id)
            except BadMetadataError as exc:
                raise OptionError(f"option jobId: {exc}") from None
        return cls(uri, name, str(opts.get("password", "")).encode("utf-8"), job_id, parse_security(opts))
