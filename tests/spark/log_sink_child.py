"""A Spark driver run as a child process by the sink's exactly-once test, so it can be killed with -9.

Usage: python log_sink_child.py URI IN_LOG OUT_LOG PASSWORD CHECKPOINT
First writes one row to a new ledger with a generated job id (whose id the driver's output must
show), then streams IN_LOG to OUT_LOG through the `pybk` sink (Trigger.AvailableNow, 100 records per
micro-batch, tasks retried once: master local[1,2]) and prints DONE. The failpoints of
`pybk.spark.logwriter.failpoint` are armed by the environment the test gives it.
"""
from __future__ import annotations

import sys

from pybk.spark.session import local_session


def main(uri: str, src: str, dst: str, password: str, checkpoint: str) -> None:
    spark = local_session("local[1,2]", "pybk-log-sink-child")
    (spark.createDataFrame([("one row",)], "payload string").write.format("pybk").mode("append")
     .option("metadataServiceUri", uri).option("password", password).save())
    df = (spark.readStream.format("pybk").option("metadataServiceUri", uri).option("log", src)
          .option("maxRecordsPerTrigger", "100").load().select("key", "payload", "timestamp"))
    query = (df.writeStream.format("pybk").option("metadataServiceUri", uri).option("log", dst)
             .option("password", password).option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    print("DONE", flush=True)
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:6])
