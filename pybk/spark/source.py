"""The `pybk` PySpark data source: batch reads, streaming reads and writes of ledgers.

Planning (which ledgers, how far they are readable) runs in Spark's driver-side Python worker
(`reader`, `discovery`); each partition is one entry range of one ledger, read straight from the
bookies by an executor's Python worker and handed to Spark as Arrow record batches (`scan`).
Readers open ledgers without recovery, so an open ledger is read up to its LAC and its writer is
never fenced. Writes go through `writer`, streaming writes through `sink`. Spark calls all of them synchronously: `runtime` runs
the asyncio client on one event loop per Python worker process.
"""
from __future__ import annotations

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from .errors import cause_first
from .logoptions import LogReadOptions, LogWriteOptions, is_log_options
from .options import OptionError, ReadOptions, WriteOptions
from .reader import LedgerBatchReader, LedgerStreamReader
from .runtime import with_credentials
from .schema import spark_schema
from .sink import LedgerStreamWriter
from .writer import LedgerWriter, payload_column


class LedgerDataSource(DataSource):
    """format('pybk'): ledgers as rows (ledger_id, entry_id, payload[, ledger_metadata]), or with
    option log, named logs as rows (log, offset, timestamp, key, payload[, producer_id, sequence]),
    or only the log columns a schema given to the read names (logscan.projection)."""

    @classmethod
    def name(cls) -> str:
        return "pybk"

    def schema(self) -> str:
        with cause_first():
            if is_log_options(self.options):
                from .logreader import include_producer
                from .logscan import log_schema
                return log_schema(include_producer(with_credentials(LogReadOptions.parse(self.options))))
            return spark_schema(ReadOptions.parse(self.options).include_metadata)

    def reader(self, schema: StructType):
        with cause_first():
            if is_log_options(self.options):
                from .logreader import LogBatchReader
                from .logscan import projection
                return LogBatchReader(with_credentials(LogReadOptions.parse(self.options)), projection(schema))
            return LedgerBatchReader(with_credentials(ReadOptions.parse(self.options)))

    def streamReader(self, schema: StructType):
        with cause_first():
            if is_log_options(self.options):
                from .logreader import LogStreamReader
                from .logscan import projection
                return LogStreamReader(with_credentials(LogReadOptions.parse(self.options)), projection(schema))
            return LedgerStreamReader(with_credentials(ReadOptions.parse(self.options)))

    def writer(self, schema: StructType, overwrite: bool):
        with cause_first():
            if is_log_options(self.options):
                from .logwriter import LogBatchWriter, log_columns
                if overwrite:
                    raise OptionError("pybk logs are append-only: use mode('append')")
                return LogBatchWriter(with_credentials(LogWriteOptions.parse(self.options)), log_columns(schema))
            opts = _write_options(self.options)
            if overwrite:
                raise OptionError("pybk ledgers are append-only: use mode('append')")
            return LedgerWriter(opts, payload_column(schema))

    def streamWriter(self, schema: StructType, overwrite: bool):
        with cause_first():
            if is_log_options(self.options):
                from .logwriter import LogStreamWriter, log_columns
                if overwrite:
                    raise OptionError("pybk logs are append-only: use outputMode('append')")
                if any(str(k).lower() == "jobid" for k in self.options):
                    raise OptionError("option jobId is for batch writes: a stream's micro-batches are jobs "
                                      "'<query id>.<batch id>'")
                return LogStreamWriter(with_credentials(LogWriteOptions.parse(self.options)), log_columns(schema))
            opts = _write_options(self.options)
            if overwrite:
                raise OptionError("pybk ledgers are append-only: use outputMode('append')")
            if any(str(k).lower() == "jobid" for k in self.options):
                raise OptionError("option jobId is for batch writes: a stream names each micro-batch's "
                                  "job '<query id>.<batch id>'")
            return LedgerStreamWriter(opts, payload_column(schema))


class PythonDataSource(LedgerDataSource):
    """The same source under the name pybk's JVM source hands the reads and writes it does not
    do itself to (PybkDataSource.PYTHON_NAME): streams, ledgers, writes, schemas."""

    @classmethod
    def name(cls) -> str:
        return "pybk_python"


def _write_options(options) -> WriteOptions:
    """A write's options with the driver's credentials; refused on the driver, before any task
    runs, when security is on and no password is given (the ledgers' master keys would be public)."""
    from pybk.client.bookkeeper import public_key_refusal
    from pybk.security.settings import ClientSecurity
    opts = with_credentials(WriteOptions.parse(options))
    refusal = public_key_refusal(opts.password, opts.security or ClientSecurity.from_env())
    if refusal:
        raise OptionError(f"option password: {refusal}; give the ledgers a password with option password")
    return opts
