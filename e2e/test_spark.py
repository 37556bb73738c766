"""On a real cluster: `pybk spark submit --apply` runs the stats job (driver in a Job's pod,
executors started by it from the Spark image) over a BookieCluster, and its counts are what was
written."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import yaml

from conftest import ROOT, kubectl, ready_with, render_chart, run_job, wait_for

NAME = "spark"
SPARK_IMAGE = os.environ.get("PYBK_E2E_SPARK_IMAGE", "pybk-spark:0.1.0")

WRITE = """
import asyncio, json, os
from pybk.client import BookKeeper
async def main():
    async with await BookKeeper.connect(os.environ["PYBK_METADATA_URI"]) as bk:
        out = {}
        for n in (50, 120, 7):
            lh = await bk.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2)
            for i in range(n):
                await lh.add_entry(b"%d" % i)
            await lh.close()
            out[lh.ledger_id] = [n, sum(len(b"%d" % i) for i in range(n))]
        print(json.dumps(out))
asyncio.run(main())
"""


def test_stats_job_in_the_cluster_counts_what_was_written(namespace, operator):
    doc = yaml.safe_load((ROOT / "examples" / "bookiecluster-minimal.yaml").read_text())
    doc["metadata"] = {"name": NAME, "namespace": namespace}
    doc["spec"].update(metadataServiceUri=operator.replace("/pybk", "/pybk-spark"), replicas=3,
                       storage={"journal": {"size": "256Mi"}, "ledgers": {"size": "512Mi"}})
    kubectl("apply", "-f", "-", input=yaml.safe_dump(doc))
    wait_for("3 ready bookies", ready_with(namespace, NAME, 3))
    rbac = [d for d in render_chart({"spark": {"rbac": {"create": True}}}, namespace)
            if d["kind"] in ("ServiceAccount", "Role", "RoleBinding") and d["metadata"]["name"] == "pybk-spark"]
    assert len(rbac) == 3
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(rbac))

    written = json.loads(run_job(namespace, "spark-write", WRITE, doc["spec"]["metadataServiceUri"])
                         .strip().splitlines()[-1])

    out = subprocess.run([sys.executable, "-m", "pybk", "spark", "submit", "-n", namespace, "--image", SPARK_IMAGE,
                          "--apply", NAME, "ledger_stats.py", "-o", "json"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    job = f"job/{NAME}-ledger-stats"
    # Client mode on a k8s master runs no task in the driver: completing means executors ran.
    kubectl("wait", "-n", namespace, job, "--for=condition=Complete", "--timeout=900s", timeout=930)
    rows = json.loads(kubectl("logs", "-n", namespace, job).strip().splitlines()[-1])
    assert {str(r["ledger_id"]): [r["entries"], r["bytes"]] for r in rows} == written
