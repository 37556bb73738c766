"""PySpark Python Data Source `pybk`: read, stream and write ledgers.

    from pybk.spark import register
    register(spark)
    spark.read.format("pybk").option("metadataServiceUri", uri).option("ledgers", "1,2,5-9").load()

Importing this package does not import pyspark; `register` does.
"""
from __future__ import annotations


def register(spark) -> None:
    """Register the `pybk` format with a SparkSession and enable Python filter pushdown."""
    import warnings
    # pyspark 4.x warns on every session that pandas 3 is "not yet fully supported"; the pybk
    # source does not use pandas (Arrow only), so the warning is noise in job output.
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")
    from .source import LedgerDataSource
    try:
        spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    except Exception:  # older Spark without the setting: filters are simply not pushed
        pass
    spark.dataSource.register(LedgerDataSource)


__all__ = ["register"]
