"""The errors of named logs; each message's first line names the log and the cause."""
from __future__ import annotations

from pybk.client.errors import BKError


class LogError(BKError):
    """Base of every named-log error."""


class InvalidLogConfigError(LogError, ValueError):
    """A log name, configuration or option is invalid; the message says which and why."""


class LogExistsError(LogError):
    """Creating a log whose name is taken."""

    def __init__(self, name: str):
        self.name = name
        super().__init__(f"log {name!r} already exists: open it, or delete it first to start over")


class LogNotFoundError(LogError):
    """Opening, reading or deleting a log name that does not exist (never created, or deleted)."""

    def __init__(self, name: str):
        self.name = name
        super().__init__(f"log {name!r} does not exist: create it first")


class LogInUseError(LogError):
    """Deleting a log that a live writer has open."""


class LogFencedError(LogError):
    """A newer writer took the log over (its epoch is registered): this writer may append no more.
    Like a timeout, it does not say whether a pending append was stored: read the log to see
    (with an idempotent producer, resending is safe)."""

    def __init__(self, name: str, epoch: int, detail: str = ""):
        self.name = name
        self.epoch = epoch
        super().__init__(f"log {name!r} was taken over by a writer of epoch {epoch}: this writer may append "
                         f"no more" + (f" ({detail})" if detail else ""))


class LogTruncatedError(LogError):
    """Reading below the log's start offset: those records were deleted by truncation or retention."""

    def __init__(self, name: str, offset: int, start: int):
        self.name = name
        self.offset = offset
        self.start = start
        super().__init__(f"offset {offset} of log {name!r} is below its start offset {start}: the records "
                         f"before {start} were truncated; read from {start} (or from a cursor)")


class LogClosedError(LogError):
    """The writer or reader was closed, or failed earlier (the message names the first failure)."""


class CorruptEntryError(LogError, ValueError):
    """An entry of a segment does not decode as a batch of records (hostile or damaged bytes)."""


class DuplicateSequenceError(LogError):
    """An idempotent producer re-sent a sequence number stored too long ago for its offset to be
    remembered: the record is stored once, at an offset this writer no longer knows."""

    def __init__(self, name: str, producer_id: int, sequence: int, last: int):
        self.producer_id = producer_id
        self.sequence = sequence
        self.last = last
        super().__init__(f"log {name!r}: producer {producer_id} sequence {sequence} is already stored (the "
                         f"producer's last stored sequence is {last}); its offset is older than the "
                         f"deduplication window")


class CursorError(LogError):
    """A cursor commit that would move the cursor backwards, or a cursor that does not exist."""
