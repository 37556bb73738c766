"""Per-minute record counts by key of named logs, written to Parquet (partitioned by log), with Spark.

    python spark/log_counts.py -m etcd://127.0.0.1:2379/pybk --log 'orders.*' /tmp/order-counts
    spark-submit spark/log_counts.py -m etcd://127.0.0.1:2379/pybk --log orders /data/order-counts

Importable: `log_minute_counts(spark, uri, logs) -> DataFrame`, `main(argv) -> int`.
"""
from __future__ import annotations

import sys

from pybk.spark.jobs import log_counts_main as main, log_minute_counts

__all__ = ["log_minute_counts", "main"]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
