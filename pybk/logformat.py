"""How every pybk process writes its log: `text` lines for people at a terminal, or `json`, one
object per line, for log pipelines (Loki, Elasticsearch, Cloud Logging, `kubectl logs | jq`).

A JSON line always has `timestamp` (RFC 3339, UTC, milliseconds), `level`, `logger` and
`message` (the formatted text, the same words as the text format). It adds the context a log call
passes in `extra=` under one of `CONTEXT_FIELDS` (e.g. `log.warning("ledger %d: ...", lid,
extra={"ledger_id": lid})`), the process-wide fields set with `set_process_fields` (`bookie_id`,
a bookie's own id, on every line it writes), the Kubernetes object an operator message is about, and `exception` (the whole traceback as
one string) when there is one. Text lines stay as they were: context is already in the message.
"""
from __future__ import annotations

import datetime
import enum
import json
import logging
import os
import sys
from typing import Any, Mapping

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
ENV = "PYBK_LOG_FORMAT"  # the variable of the log_format option (pybk.config), read here by from_env

# `bookie` is a bookie the message is about (a replica, a lost bookie); a bookie's own id is the
# process field `bookie_id` on every line it writes.
CONTEXT_FIELDS = ("ledger_id", "entry_id", "entry_range", "bookie", "fragment", "job_id")

_PROCESS_FIELDS: dict[str, Any] = {}
_CONFIGURED: list["LogFormat"] = []  # the format `configure` set up, if it did


class LogFormat(enum.StrEnum):
    TEXT = "text"
    JSON = "json"


def parse_log_format(text: str | LogFormat) -> LogFormat:
    """'text' or 'json' (any case) -> LogFormat; ValueError naming both otherwise."""
    try:
        return LogFormat(str(text).strip().lower())
    except ValueError:
        raise ValueError(f"not a log format: {text!r} (use text or json)") from None


def from_env(environ: Mapping[str, str] | None = None) -> LogFormat:
    """The format `PYBK_LOG_FORMAT` names, text when it is unset or unknown: for helpers that run
    before (or without) a process's own settings, such as the bookie entrypoint's zone lookup."""
    try:
        return parse_log_format((os.environ if environ is None else environ).get(ENV, LogFormat.TEXT))
    except ValueError:
        return LogFormat.TEXT


def set_process_fields(**fields: Any) -> None:
    """Fields every JSON line of this process carries from now on (None removes one)."""
    for name, value in fields.items():
        if value is None:
            _PROCESS_FIELDS.pop(name, None)
        else:
            _PROCESS_FIELDS[name] = value


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (newlines inside values are escaped)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "timestamp": datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc)
            .isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        out.update(_PROCESS_FIELDS)
        for name in CONTEXT_FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                out[name] = value
        ref = record.__dict__.get("k8s_ref")  # kopf's per-object loggers name the object this way
        if isinstance(ref, dict):
            out["object"] = {k: ref[k] for k in ("kind", "namespace", "name") if ref.get(k)}
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str, ensure_ascii=False)


def formatter(fmt: LogFormat) -> logging.Formatter:
    """The formatter of a format."""
    return JsonFormatter() if fmt is LogFormat.JSON else logging.Formatter(TEXT_FORMAT)


def configure(level: str | int, fmt: LogFormat = LogFormat.TEXT) -> None:
    """Send the root logger's records to stderr in `fmt` at `level` (a no-op when logging is set up
    already, as under pytest)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(fmt))
    logging.basicConfig(level=level, handlers=[handler])
    if fmt is LogFormat.JSON:
        logging.captureWarnings(True)  # a library's warning is a log line too, not a stray text line
    _CONFIGURED[:] = [fmt]


def fatal(logger: str, text: str) -> None:
    """Print why a process stops (`pybk bookie: refusing to start: ...`) on stderr: the text as it
    is, or in the json format a CRITICAL line carrying it as its message."""
    if _CONFIGURED == [LogFormat.JSON]:
        record = logging.LogRecord(logger, logging.CRITICAL, "", 0, text, None, None)
        print(JsonFormatter().format(record), file=sys.stderr, flush=True)
    else:
        print(text, file=sys.stderr, flush=True)


def event_line(logger: str, message: str, **fields: Any) -> str:
    """A machine-readable event a process prints on stdout (a bookie's `ready`): the JSON of
    `fields`, which in the json log format also carries a log line's fields, so that every line
    of the container's output parses the same way."""
    if _CONFIGURED != [LogFormat.JSON]:
        return json.dumps(fields)
    record = logging.LogRecord(logger, logging.INFO, "", 0, message, None, None)
    return json.dumps({**json.loads(JsonFormatter().format(record)), **fields}, default=str)
