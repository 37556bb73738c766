"""PySpark Python Data Source `pybk`: read, stream and write ledgers.

    from pybk.spark import register
    register(spark)
    spark.read.format("pybk").option("metadataServiceUri", uri).option("ledgers", "1,2,5-9").load()

    pybk.spark.written_ledgers(uri, job_id)   # {partition: ledger id} a write job committed

Importing this package does not import pyspark; `register` does.
"""
from __future__ import annotations


def register(spark) -> None:
    """Register the `pybk` format with a SparkSession and enable Python filter pushdown. With
    pybk's jar on the session's classpath (`pybk.spark.session.jar_conf`), format("pybk") is
    its JVM source, which reads batch scans of logs itself and hands everything else to the
    Python source: register then also tells it where to plan (`jvm.bridge`)."""
    import warnings
    # pyspark 4.x warns on every session that pandas 3 is "not yet fully supported"; the pybk
    # source does not use pandas (Arrow only), so the warning is noise in job output.
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")
    from .source import LedgerDataSource
    try:
        spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    except Exception:  # older Spark without the setting: filters are simply not pushed
        pass
    from .jvm.bridge import attach
    from .source import PythonDataSource
    spark.dataSource.register(PythonDataSource)
    if not attach(spark):   # Spark refuses a Python source the name of a JVM one
        spark.dataSource.register(LedgerDataSource)


def written_ledgers(uri: str, job_id: str) -> dict[int, int]:
    """{partition: ledger id} of what the write job `job_id` wrote to the cluster at uri: its
    committed ledgers (none if it aborted; every ledger tagged with it while undecided, or once
    its record was removed after the retention). Plain synchronous Python: callable from a
    driver program, a notebook (even one with a running event loop) or a script."""
    import asyncio
    import concurrent.futures

    from pybk.meta import MetadataStore
    from pybk.meta.jobs import check_job_id

    from pybk.meta import job_gc as gc

    check_job_id(job_id)

    async def ask() -> dict[int, int]:
        async with await MetadataStore.connect(uri) as store:
            return await gc.written(store, job_id)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(ask())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # a loop runs here: use another thread's
        return pool.submit(asyncio.run, ask()).result()


__all__ = ["register", "written_ledgers"]
