"""The `pybk` data source on a local cluster started `pybk local up --secure`: TLS, etcd auth and
tokens, with the credentials as options or found in the cluster's local.json."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_spark_log_jvm import jvm_reads

from pybk.local.client import read_client
from pybk.security.settings import ENV
from pybk.spark.session import activate

ROOT = Path(__file__).resolve().parents[2]
PW = "spark secret"


async def test_spark_writes_and_reads_ledgers_on_a_secured_local_cluster(spark, secured):
    from pybk.client import BookKeeper
    from pybk.spark import written_ledgers
    cluster = read_client(secured)
    credentials = cluster.security.as_mapping()
    rows = [(f"row-{i}".encode(),) for i in range(40)]

    def write_then_read():
        activate(spark)
        df = spark.createDataFrame(rows, "payload binary").repartition(2)
        (df.write.format("pybk").mode("append").option("metadataServiceUri", cluster.metadata_uri)
         .options(**credentials).option("password", PW).option("ensembleSize", 3)
         .option("jobId", "secure-job").save())
        ledgers = written_ledgers(cluster.metadata_uri, "secure-job")
        read = (spark.read.format("pybk").option("metadataServiceUri", cluster.metadata_uri)
                .options(**credentials).option("password", PW)
                .option("ledgers", ",".join(map(str, ledgers.values()))).load())
        return ledgers, sorted(bytes(r.payload) for r in read.collect())

    ledgers, payloads = await asyncio.to_thread(write_then_read)
    assert len(ledgers) == 2 and payloads == sorted(p for (p,) in rows)
    # what Spark wrote is what the library reads, ledger by ledger
    async with await BookKeeper.connect(cluster.metadata_uri, security=cluster.security) as bk:
        stored = []
        for lid in ledgers.values():
            rh = await bk.open_ledger(lid, password=PW.encode(), recovery=False)
            stored += [bytes(e.data) async for e in rh.read_entries(0, rh.metadata.last_entry_id)]
    assert sorted(stored) == payloads

    def read_without_token():
        activate(spark)
        return (spark.read.format("pybk").option("metadataServiceUri", cluster.metadata_uri)
                .option("tls_ca", cluster.security.tls_ca).option("password", PW)
                .option("ledgers", ",".join(map(str, ledgers.values()))).load().collect())
    with pytest.raises(Exception, match="UNAUTHENTICATED"):
        await asyncio.to_thread(read_without_token)


async def test_the_jvm_reader_reads_a_log_over_tls_with_a_token(spark, secured):
    """pybk's JVM reader makes the bookies' Read call with the credentials Spark was given: over TLS,
    with the token; without the token, the bookies refuse it and the error says so."""
    from pybk.client import BookKeeper
    from pybk.log import Logs
    cluster = read_client(secured)
    credentials = cluster.security.as_mapping()
    async with await BookKeeper.connect(cluster.metadata_uri, security=cluster.security) as bk:
        logs = Logs(bk)
        await logs.create("secure.jvm", password=PW.encode())
        async with await logs.open_writer("secure.jvm", password=PW.encode()) as w:
            await w.append_many([b"r%d" % i for i in range(300)])

    def scan(options):
        activate(spark)
        df = (spark.read.format("pybk").option("metadataServiceUri", cluster.metadata_uri).options(**options)
              .option("log", "secure.jvm").load())
        assert jvm_reads(df)
        return sorted((r.offset, bytes(r.payload)) for r in df.collect())

    assert await asyncio.to_thread(scan, credentials) == [(i, b"r%d" % i) for i in range(300)]
    with pytest.raises(Exception, match="UNAUTHENTICATED"):   # TLS, but neither token nor client certificate
        await asyncio.to_thread(scan, {"tls_ca": cluster.security.tls_ca})


def test_a_job_given_the_local_clusters_uri_finds_its_credentials_in_local_json(secured):
    """A Spark job given only the local cluster's URI reads its ledgers, taking the credentials from the
    cluster's local.json.

    Slow: the job runs as its own process, as a user runs it, so it starts a Spark JVM of its own."""
    cluster = read_client(secured)
    lid = asyncio.run(_write(cluster, entries=7))
    env = {k: v for k, v in os.environ.items() if k not in ENV.values()}
    job = subprocess.run([sys.executable, str(ROOT / "spark" / "ledger_stats.py"), "-m", cluster.metadata_uri,
                          "--ledgers", str(lid), "--password", PW, "-o", "json"],
                         capture_output=True, text=True, timeout=300, env={**env, "PYBK_LOCAL_DIR": str(secured)})
    assert job.returncode == 0, job.stderr[-3000:]
    rows = json.loads(job.stdout.strip().splitlines()[-1])
    assert [(r["ledger_id"], r["entries"]) for r in rows] == [(lid, 7)]


async def _write(cluster, entries: int) -> int:
    from pybk.client import BookKeeper
    async with await BookKeeper.connect(cluster.metadata_uri, security=cluster.security) as bk:
        lh = await bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2, password=PW.encode())
        for i in range(entries):
            await lh.add_entry(b"e%d" % i)
        await lh.close()
    return lh.ledger_id


def test_credentials_are_resolved_on_the_driver_only_for_the_local_clusters_uri(tmp_path, monkeypatch):
    from pybk.spark.options import ReadOptions, WriteOptions
    from pybk.spark.runtime import with_credentials
    security = {"tls_ca": "/s/ca.crt", "tls_cert": "/s/admin/tls.crt", "tls_key": "/s/admin/tls.key",
                "token_file": "/s/tokens/admin.token"}
    uri = "etcd://127.0.0.1:7/pybk?tls_ca=/s/ca.crt&user=pybk&password_file=/s/pw"
    (tmp_path / "local.json").write_text(json.dumps({"metadata_service_uri": uri, "security": security}))
    monkeypatch.setenv("PYBK_LOCAL_DIR", str(tmp_path))
    for var in ENV.values():
        monkeypatch.delenv(var, raising=False)
    assert with_credentials(ReadOptions.parse({"metadataServiceUri": uri})).security.as_mapping() == security
    assert with_credentials(WriteOptions.parse({"metadataServiceUri": uri})).security.as_mapping() == security
    # given options win; another cluster gets nothing (its executors use their own environment)
    given = ReadOptions.parse({"metadataServiceUri": uri, "token_file": "/mine"})
    assert with_credentials(given).security.as_mapping() == {"token_file": "/mine"}
    assert with_credentials(ReadOptions.parse({"metadataServiceUri": "etcd://10.0.0.1:2379/pybk"})).security is None
