"""Export ledgers of a pybk cluster to Parquet (partitioned by ledger_id), with Spark.

    python spark/export_parquet.py -m etcd://127.0.0.1:2379/pybk --ledgers 1-9 /tmp/ledgers.parquet
    spark-submit spark/export_parquet.py -m etcd://127.0.0.1:2379/pybk /data/ledgers

Importable: `export_parquet(spark, uri, path, ledgers) -> rows`, `main(argv) -> int`.
"""
from __future__ import annotations

import sys

from pybk.spark.jobs import export_main as main, export_parquet

__all__ = ["export_parquet", "main"]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
