"""On a real cluster: install the chart, apply a BookieCluster, write ledgers, scale 3 -> 4 -> 3,
and verify that every acknowledged entry is still there, unchanged."""
from __future__ import annotations

import json

import yaml

from conftest import ROOT, cluster_status, condition, kubectl, ready_with, run_job, wait_for

NAME = "e2e"

WRITE = """
import asyncio, hashlib, json, os
from pybk.client import BookKeeper, DigestType
async def main():
    async with await BookKeeper.connect(os.environ["PYBK_METADATA_URI"]) as bk:
        out = {}
        for n in range(5):
            lh = await bk.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2,
                                        digest=DigestType.CRC32C, password=b"e2e")
            for i in range(200):
                await lh.add_entry(f"ledger {n} entry {i}".encode() * 10)
            await lh.close()
            out[lh.ledger_id] = 200
        print(json.dumps(out))
asyncio.run(main())
"""

READ = """
import asyncio, hashlib, json, os
from pybk.client import BookKeeper
async def main():
    async with await BookKeeper.connect(os.environ["PYBK_METADATA_URI"]) as bk:
        out = {}
        for lid in json.loads(os.environ["LEDGERS"]):
            rh = await bk.open_ledger(int(lid), password=b"e2e")
            out[lid] = [e.data.decode() async for e in rh.read_entries(0, rh.last_add_confirmed)]
        print(json.dumps(out))
asyncio.run(main())
"""


def test_scale_up_and_down_loses_nothing(namespace, operator):
    doc = yaml.safe_load((ROOT / "examples" / "bookiecluster-minimal.yaml").read_text())
    doc["metadata"] = {"name": NAME, "namespace": namespace}
    doc["spec"].update(metadataServiceUri=operator, replicas=3, pvcPolicy="Delete",
                       storage={"journal": {"size": "256Mi"}, "ledgers": {"size": "512Mi"}})
    kubectl("apply", "-f", "-", input=yaml.safe_dump(doc))
    wait_for("3 ready bookies", ready_with(namespace, NAME, 3))

    written = json.loads(run_job(namespace, "write", WRITE, operator).strip().splitlines()[-1])
    assert len(written) == 5

    kubectl("scale", "bookiecluster", NAME, "-n", namespace, "--replicas=4")
    wait_for("4 ready bookies", ready_with(namespace, NAME, 4))

    kubectl("scale", "bookiecluster", NAME, "-n", namespace, "--replicas=3")
    wait_for("the decommission of bookie 3 to show", lambda: condition(
        cluster_status(namespace, NAME), "Decommissioning").get("status") == "True" or
        cluster_status(namespace, NAME).get("replicas") == 3, timeout=300, interval=2)
    st = wait_for("3 ready bookies after the scale-down", ready_with(namespace, NAME, 3))
    assert f"{NAME}-3.{NAME}.{namespace}.svc:3181" not in st["writableBookies"] + st.get("readonlyBookies", [])
    wait_for("bookie 3's volumes deleted (pvcPolicy Delete)", lambda: not kubectl(
        "get", "pvc", "-n", namespace, f"journal-{NAME}-3", f"ledgers-{NAME}-3", "--ignore-not-found", "-o", "name"))

    job = run_job(namespace, "read", READ.replace('os.environ["LEDGERS"]', repr(json.dumps(list(written)))),
                  operator)
    read = json.loads(job.strip().splitlines()[-1])
    for lid, count in written.items():
        n = list(written).index(lid)
        assert read[str(lid)] == [f"ledger {n} entry {i}" * 10 for i in range(count)]
