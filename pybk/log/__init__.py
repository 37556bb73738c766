"""Named logs: durable, ordered, replayable logs of records built on ledgers (docs/logs.md).

    from pybk.client import BookKeeper
    from pybk.log import Logs
    async with await BookKeeper.connect("etcd://127.0.0.1:2379/pybk") as bk:
        logs = Logs(bk)
        await logs.create("orders", password=b"secret")
        async with await logs.open_writer("orders", password=b"secret") as w:
            offset = await w.append(b"order 1")
"""
from .codec import LogRecord
from .errors import (CorruptEntryError, CursorError, DuplicateSequenceError, InvalidLogConfigError, LogClosedError,
                     LogError, LogExistsError, LogFencedError, LogInUseError, LogNotFoundError, LogTruncatedError)
from .layout import LogState, Segment, SegmentState
from .logs import CursorInfo, LogDescription, LogRef, Logs
from .options import LogConfig, Retention, RetentionPolicy, Rollover, WriterOptions
from .reader import LogReader
from .writer import LogWriter, PendingAppend

__all__ = ["CorruptEntryError", "CursorError", "CursorInfo", "DuplicateSequenceError", "InvalidLogConfigError",
           "LogClosedError", "LogConfig", "LogDescription", "LogError", "LogExistsError", "LogFencedError",
           "LogInUseError", "LogNotFoundError", "LogReader", "LogRecord", "LogRef", "LogState", "LogTruncatedError",
           "LogWriter", "Logs", "PendingAppend", "Retention", "RetentionPolicy", "Rollover", "Segment",
           "SegmentState", "WriterOptions"]
