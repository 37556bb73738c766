"""`python -m pybk.operator.podzone`: print this pod's zone, for the bookie entrypoint.

The operator copies each bookie pod's node zone (the node label named by
spec.zoneSpreading.topologyKey) onto the pod as the `pybk.io/zone` annotation; a pod cannot
read node labels itself without cluster-wide rights. This reads the pod through the in-cluster
API (its ServiceAccount may `get pods`) and waits up to --wait seconds for the annotation.
Prints an empty line when there is none (the bookie then advertises no zone).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import ssl
import sys
import time
import urllib.request
from collections.abc import Mapping

from pybk import logformat

SA = "/var/run/secrets/kubernetes.io/serviceaccount"
ANNOTATION = "pybk.io/zone"
log = logging.getLogger("pybk.operator.podzone")


POD_ENV = ("POD_NAME", "POD_NAMESPACE", "KUBERNETES_SERVICE_HOST")


def missing_pod_env(env: Mapping[str, str]) -> list[str]:
    """The variables a pod has (downward API and in-cluster service) that `env` lacks."""
    return [var for var in POD_ENV if not env.get(var)]


def pod_annotations(namespace: str, name: str) -> dict[str, str]:
    host = os.environ["KUBERNETES_SERVICE_HOST"]
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    token = open(f"{SA}/token").read().strip()
    ctx = ssl.create_default_context(cafile=f"{SA}/ca.crt")
    req = urllib.request.Request(f"https://{host}:{port}/api/v1/namespaces/{namespace}/pods/{name}",
                                 headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, context=ctx, timeout=5) as resp:
        return json.load(resp)["metadata"].get("annotations") or {}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--wait", type=float, default=30.0, help="seconds to wait for the annotation (default 30)")
    args = p.parse_args(argv)
    logformat.configure(logging.INFO, logformat.from_env())  # stderr, as the bookie will log
    name, namespace = os.environ.get("POD_NAME"), os.environ.get("POD_NAMESPACE")
    missing = missing_pod_env(os.environ)
    if missing:
        log.warning("not in a Kubernetes pod (%s unset); no zone", "/".join(missing))
        print("")
        return 0
    deadline = time.monotonic() + args.wait
    while True:
        try:
            annotations = pod_annotations(namespace, name)
            if ANNOTATION in annotations:
                print(annotations[ANNOTATION])
                return 0
        except (OSError, ValueError, KeyError) as e:
            log.warning("reading pod %s/%s: %s", namespace, name, e)
        if time.monotonic() >= deadline:
            log.warning("no %s annotation after %.0fs; no zone", ANNOTATION, args.wait)
            print("")
            return 0
        time.sleep(1)


if __name__ == "__main__":
    sys.exit(main())
