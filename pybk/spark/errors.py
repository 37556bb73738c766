"""Errors of the `pybk` data source as the user sees them: the cause on the first line.

PySpark 4.3 runs every DataSource method in a Python worker; when one raises, the worker
(`pyspark.util.handle_worker_exception`) sends the JVM the formatted exception, then exits, and
the JVM wraps that text as `[PYTHON_DATA_SOURCE_ERROR] Failed to <action> Python data source
<type>: <text>` (planning), a `PythonException` (a task) or a `StreamingQueryException`. Nothing
in PySpark reads an error class or a PySparkException subclass from a data source's exception:
the text is all that travels, and it starts with `Traceback (most recent call last):` unless the
worker's `SPARK_HIDE_TRACEBACK` is set (what `spark.sql.execution.pyspark.udf.hideTraceback.enabled`
sets for every Python worker of a session), in which case it is `<module.Class>: <message>`.

So `cause_first` sets `SPARK_HIDE_TRACEBACK` in the worker just before one of our errors leaves a
data source method: the worker exits right after reporting it, so no other code in that process
is affected, and user UDFs elsewhere keep their tracebacks. Our errors are the ones whose message
says everything (`USER_ERRORS`); anything else (a bug) keeps its traceback.
"""
from __future__ import annotations

import contextlib
import os
import re
from typing import Iterator, TypeVar

from .options import OptionError

T = TypeVar("T")


class PybkSparkError(Exception):
    """An error of the pybk data source whose message is the whole story (what failed, on what,
    and what to do), e.g. data loss in a stream or a ledger the passwords do not open."""


def _user_errors() -> tuple[type[BaseException], ...]:
    from pybk.client.errors import BKError
    from pybk.meta.errors import MetadataError
    return (OptionError, PybkSparkError, BKError, MetadataError)


def is_user_error(exc: BaseException) -> bool:
    """Whether exc is one of our errors whose message says everything (no traceback needed)."""
    return isinstance(exc, _user_errors())


def hide_worker_traceback() -> None:
    """Make this Spark Python worker report the exception being raised as `<Class>: <message>`."""
    os.environ["SPARK_HIDE_TRACEBACK"] = "1"


@contextlib.contextmanager
def cause_first() -> Iterator[None]:
    """Wrap the body of a DataSource / reader / writer method (driver or executor side): one of
    our errors raised inside reaches the user with its message on the first line of Spark's error,
    not after a traceback. Other exceptions pass unchanged."""
    try:
        yield
    except _user_errors():
        hide_worker_traceback()
        raise


def cause_first_iter(batches: Iterator[T]) -> Iterator[T]:
    """`cause_first` for what read() returns: Spark pulls the iterator after read() has returned,
    so the errors of the scan itself surface here."""
    with cause_first():
        yield from batches


_OURS = re.compile(r"pybk\.[\w.]*?\.(?:\w*Error|\w*Exception): ([^\n]*)")


def cause_line(exc: BaseException) -> str:
    """One line for a command line's error output: the message of our error inside a Spark error
    (what a driver catches: AnalysisException, PythonException, StreamingQueryException), else
    the exception's own first line."""
    text = str(exc)
    m = _OURS.search(text)
    if m:
        return m.group(1).strip()
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return first or type(exc).__name__
