"""Example Spark jobs: per-ledger statistics and export to Parquet of ledgers, and per-minute
counts by key of a named log written to Parquet.

The functions take a SparkSession and return DataFrames / counts, so the demo and tests can call
them; `stats_main` / `export_main` are the command lines behind `spark/ledger_stats.py` and
`spark/export_parquet.py` (runnable with `python` or `spark-submit`).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Callable, Sequence

from pybk.shell.format import format_table


def reader(spark: Any, uri: str, ledgers: str = "all", password: str = "", **options: Any) -> Any:
    """spark.read.format('pybk') with the common options set."""
    r = (spark.read.format("pybk").option("metadataServiceUri", uri).option("ledgers", ledgers)
         .option("password", password))
    for key, value in options.items():
        r = r.option(key, str(value).lower() if isinstance(value, bool) else str(value))
    return r.load()


def ledger_stats(spark: Any, uri: str, ledgers: str = "all", password: str = "") -> Any:
    """Per ledger: entries, payload bytes, first and last entry id, ordered by ledger id."""
    from pyspark.sql import functions as F
    df = reader(spark, uri, ledgers, password)
    return (df.groupBy("ledger_id")
              .agg(F.count(F.lit(1)).alias("entries"),
                   F.sum(F.length("payload")).alias("bytes"),
                   F.min("entry_id").alias("first_entry"),
                   F.max("entry_id").alias("last_entry"))
              .orderBy("ledger_id"))


def export_parquet(spark: Any, uri: str, path: str, ledgers: str = "all", password: str = "",
                   include_metadata: bool = False, mode: str = "overwrite") -> int:
    """Write the ledgers' entries to Parquet under path, partitioned by ledger_id; returns rows."""
    return _to_parquet(reader(spark, uri, ledgers, password, includeMetadata=include_metadata), path, mode,
                       "ledger_id")


def log_minute_counts(spark: Any, uri: str, logs: str, password: str = "", **options: Any) -> Any:
    """Per log, minute (of the records' timestamps, UTC) and key: records and payload bytes, in
    that order. `logs`: names or patterns as option log takes them; options: the source's (e.g.
    startingTimestamp)."""
    from pyspark.sql import functions as F
    r = spark.read.format("pybk").option("metadataServiceUri", uri).option("log", logs)
    if password:
        r = r.option("password", password)
    for key, value in options.items():
        r = r.option(key, str(value))
    return (r.load()
            .groupBy("log", F.date_trunc("minute", "timestamp").alias("minute"), F.col("key").cast("string").alias("key"))
            .agg(F.count(F.lit(1)).alias("records"), F.sum(F.length("payload")).alias("bytes"))
            .orderBy("log", "minute", "key"))


def export_log_counts(spark: Any, uri: str, logs: str, path: str, password: str = "", mode: str = "overwrite",
                      **options: Any) -> int:
    """Write `log_minute_counts` to Parquet under path, partitioned by log; returns the rows written."""
    return _to_parquet(log_minute_counts(spark, uri, logs, password, **options), path, mode, "log")


def _to_parquet(df: Any, path: str, mode: str, partition_by: str) -> int:
    """Write df to Parquet under path, partitioned by one column; returns the rows written (df is
    cached meanwhile, so its source is read once)."""
    df = df.cache()
    try:
        rows = df.count()
        df.write.mode(mode).partitionBy(partition_by).parquet(path)
        return rows
    finally:
        df.unpersist()


def job_session(app_name: str, master: str | None) -> Any:
    """The session of spark-submit when run under it, else a local one (local[2] by default)."""
    from .session import local_session
    if master is None and "PYSPARK_GATEWAY_PORT" in os.environ:  # launched by spark-submit
        from pyspark.sql import SparkSession
        from . import register
        spark = (SparkSession.builder.appName(app_name)
                 .config("spark.pyspark.python", sys.executable).getOrCreate())
        register(spark)
        return spark
    return local_session(master or "local[2]", app_name)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--metadata-service-uri", "-m", required=True,
                        help="cluster metadata, e.g. etcd://127.0.0.1:2379/pybk")
    parser.add_argument("--ledgers", "-l", default="all",
                        help="ledger ids: '1,2,5-9', open-ended '10-', or 'all' (default)")
    parser.add_argument("--password", default="", help="ledger password (default empty)")
    parser.add_argument("--master", default=None,
                        help="Spark master (default: spark-submit's, else local[2])")
    parser.add_argument("-o", "--output", choices=("table", "json"), default="table",
                        help="table for humans (default) or json for scripts")


def _session_or_none(prog: str, app_name: str, master: str | None):
    """The job's Spark session, or None after saying plainly that Java is missing."""
    from .session import JavaMissingError
    try:
        return job_session(app_name, master)
    except JavaMissingError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return None


def _failed(prog: str, exc: Exception) -> int:
    """Say in one line why the job failed (`prog: <cause>`, no traceback); the exit status 1."""
    from .errors import cause_line
    print(f"{prog}: {cause_line(exc)}", file=sys.stderr)
    return 1


def _write_job(prog: str, app_name: str, args: argparse.Namespace, done: str,
               job: Callable[[Any], int]) -> int:
    """Run a job that writes `args.path` and returns the rows written; say so as JSON or as `done`
    (formatted with rows and path). Exit status 2 without Java, 1 when the job failed."""
    spark = _session_or_none(prog, app_name, args.master)
    if spark is None:
        return 2
    try:
        rows = job(spark)
    except Exception as exc:
        return _failed(prog, exc)
    if args.output == "json":
        print(json.dumps({"path": args.path, "rows": rows}))
    else:
        print(done.format(rows=rows, path=args.path))
    return 0


def stats_main(argv: Sequence[str] | None = None) -> int:
    """Command line of spark/ledger_stats.py."""
    parser = argparse.ArgumentParser(prog="ledger_stats",
                                     description="Per-ledger statistics: entries, bytes, first/last entry.")
    _common(parser)
    args = parser.parse_args(argv)
    spark = _session_or_none("ledger_stats", "pybk-ledger-stats", args.master)
    if spark is None:
        return 2
    try:
        rows = [r.asDict() for r in ledger_stats(spark, args.metadata_service_uri, args.ledgers,
                                                  args.password).collect()]
    except Exception as exc:
        return _failed("ledger_stats", exc)
    if args.output == "json":
        print(json.dumps(rows))
    else:
        columns = ["ledger_id", "entries", "bytes", "first_entry", "last_entry"]
        print(format_table(columns, [[r[c] for c in columns] for r in rows], empty="no entries"))
    return 0


def export_main(argv: Sequence[str] | None = None) -> int:
    """Command line of spark/export_parquet.py."""
    parser = argparse.ArgumentParser(prog="export_parquet",
                                     description="Export ledgers to Parquet, partitioned by ledger_id.")
    _common(parser)
    parser.add_argument("path", help="output directory (replaced unless --mode append)")
    parser.add_argument("--include-metadata", action="store_true",
                        help="add the ledger_metadata column (custom metadata)")
    parser.add_argument("--mode", choices=("overwrite", "append", "error"), default="overwrite",
                        help="what to do when path exists (default overwrite)")
    args = parser.parse_args(argv)
    return _write_job("export_parquet", "pybk-export-parquet", args, "exported {rows} entries to {path}",
                      lambda spark: export_parquet(spark, args.metadata_service_uri, args.path, args.ledgers,
                                                   args.password, args.include_metadata, args.mode))


def log_counts_main(argv: Sequence[str] | None = None) -> int:
    """Command line of spark/log_counts.py."""
    parser = argparse.ArgumentParser(prog="log_counts",
                                     description="Per-minute record counts by key of named logs, written to Parquet.")
    parser.add_argument("--metadata-service-uri", "-m", required=True,
                        help="cluster metadata, e.g. etcd://127.0.0.1:2379/pybk")
    parser.add_argument("--log", required=True, help="log names, comma-separated, or patterns such as 'orders.*'")
    parser.add_argument("--password", default="", help="the logs' password (only MAC-signed logs need one)")
    parser.add_argument("--starting-timestamp", type=int, default=None,
                        help="count only records at or after this time (ms since the epoch)")
    parser.add_argument("--master", default=None, help="Spark master (default: spark-submit's, else local[2])")
    parser.add_argument("--mode", choices=("overwrite", "append", "error"), default="overwrite",
                        help="what to do when path exists (default overwrite)")
    parser.add_argument("path", help="output directory (Parquet, partitioned by log)")
    parser.add_argument("-o", "--output", choices=("table", "json"), default="table",
                        help="table for humans (default) or json for scripts")
    args = parser.parse_args(argv)
    options = {} if args.starting_timestamp is None else {"startingTimestamp": args.starting_timestamp}
    return _write_job("log_counts", "pybk-log-counts", args, "wrote {rows} per-minute counts to {path}",
                      lambda spark: export_log_counts(spark, args.metadata_service_uri, args.log, args.path,
                                                      args.password, args.mode, **options))
