"""Per-ledger statistics (entries, bytes, first/last entry) of a pybk cluster, with Spark.

    python spark/ledger_stats.py -m etcd://127.0.0.1:2379/pybk --ledgers all
    spark-submit spark/ledger_stats.py -m etcd://127.0.0.1:2379/pybk -o json

Importable: `ledger_stats(spark, uri, ledgers) -> DataFrame`, `main(argv) -> int`.
"""
from __future__ import annotations

import sys

from pybk.spark.jobs import ledger_stats, stats_main as main

__all__ = ["ledger_stats", "main"]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
